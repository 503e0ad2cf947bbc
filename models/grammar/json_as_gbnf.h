// JSON written as a GBNF grammar, in the shape of llama.cpp's json.gbnf (its strings leave out
// DEL and the control characters): what the grammar tests and tophat-bench-json-mask run
// beside the built-in JSON automaton. Header-only.
#pragma once

#include <string_view>

namespace tophat {

inline constexpr std::string_view kJsonAsGbnf = R"g(
    root   ::= object
    value  ::= object | array | string | number | ("true" | "false" | "null") ws
    object ::= "{" ws ( string ":" ws value ("," ws string ":" ws value)* )? "}" ws
    array  ::= "[" ws ( value ("," ws value)* )? "]" ws
    string ::= "\"" ( [^"\\\x7F\x00-\x1F] | "\\" (["\\/bfnrt] | "u" [0-9a-fA-F]{4}) )* "\"" ws
    number ::= "-"? ([0-9] | [1-9] [0-9]{0,15}) ("." [0-9]+)? ([eE] [-+]? [0-9]{1,3})? ws
    ws     ::= | " " | "\n" [ \t]{0,20}
  )g";

}  // namespace tophat
