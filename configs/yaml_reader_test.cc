#include "configs/yaml_reader.h"

#include <catch2/catch.hpp>
#include <map>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "base/test_util.h"

namespace tophat {
namespace {

YamlReader MustParse(std::string_view yaml) {
  absl::StatusOr<YamlReader> reader = YamlReader::Parse(yaml, "test.yaml");
  INFO(reader.status().ToString());
  REQUIRE(reader.ok());
  return *std::move(reader);
}

std::string FinishMessage(YamlReader& reader) {
  const absl::Status status = reader.Finish();
  REQUIRE_FALSE(status.ok());
  CHECK(status.code() == absl::StatusCode::kInvalidArgument);
  return std::string(status.message());
}

TEST_CASE("ParseByteSize accepts plain integers and binary and decimal units") {
  struct Case {
    std::string_view text;
    int64_t bytes;
  };
  const Case cases[] = {
      {"0", 0},
      {"1000000", 1000000},
      {"512B", 512},
      {"1KiB", 1024},
      {"512MiB", 512LL << 20},
      {"512 MiB", 512LL << 20},
      {" 2GiB ", 2LL << 30},
      {"3TiB", 3LL << 40},
      {"1KB", 1000},
      {"5MB", 5000000},
      {"2GB", 2000000000},
      {"1TB", 1000000000000},
      {"1.5GiB", 3LL << 29},
      {"0.5KiB", 512},
      {"2.25MB", 2250000},
  };
  for (const Case& c : cases) {
    INFO(c.text);
    absl::StatusOr<int64_t> bytes = ParseByteSize(c.text);
    REQUIRE(bytes.ok());
    CHECK(*bytes == c.bytes);
  }
}

TEST_CASE("ParseByteSize rejects malformed, negative, fractional-byte and overflowing sizes") {
  for (std::string_view text :
       {"", "abc", "-1", "-1MiB", "12XB", "1mb", "1 M", "MiB", ".5GiB", "1.GiB", "1.2.3MiB", "1e6",
        "0x10", "1.5B", "0.1KiB", "9000000TiB", "99999999999999999999"}) {
    INFO(text);
    absl::StatusOr<int64_t> bytes = ParseByteSize(text);
    CHECK_FALSE(bytes.ok());
    CHECK(bytes.status().code() == absl::StatusCode::kInvalidArgument);
  }
  CHECK_THAT(std::string(ParseByteSize("0.1KiB").status().message()),
             Catch::Contains("whole number of bytes"));
  CHECK_THAT(std::string(ParseByteSize("9000000TiB").status().message()),
             Catch::Contains("too large"));
}

TEST_CASE("FormatByteSize picks the largest binary unit") {
  CHECK(FormatByteSize(0) == "0 B");
  CHECK(FormatByteSize(1023) == "1023 B");
  CHECK(FormatByteSize(1024) == "1 KiB");
  CHECK(FormatByteSize(64LL << 20) == "64 MiB");
  CHECK(FormatByteSize(3LL << 29) == "1.5 GiB");
  CHECK(FormatByteSize(1000000) == "976.6 KiB");
  CHECK(FormatByteSize(4096LL << 40) == "4 PiB");
}

TEST_CASE("YamlReader reads every type and leaves absent keys at their defaults") {
  YamlReader reader = MustParse(R"(
flag: true
count: -3
ratio: 0.25
timeout: 1.5
name: "7100"
names: [a, "b c"]
block_names:
  - x
  - y
memory: 2GiB
plain_memory: 1000000
section:
  inner: 5
  deeper:
    leaf: text
)");
  bool flag = false;
  int64_t count = 0;
  int64_t memory = 0;
  int64_t plain_memory = 0;
  int64_t inner = 0;
  int64_t absent = 42;
  double ratio = 0;
  double timeout = 0;
  std::string name;
  std::string leaf;
  std::string absent_string = "default";
  std::vector<std::string> names;
  std::vector<std::string> block_names;
  reader.ReadBool("flag", &flag);
  reader.ReadInt("count", &count);
  reader.ReadDouble("ratio", &ratio);
  reader.ReadSeconds("timeout", &timeout);
  reader.ReadString("name", &name);
  reader.ReadStringList("names", &names);
  reader.ReadStringList("block_names", &block_names);
  reader.ReadByteSize("memory", &memory);
  reader.ReadByteSize("plain_memory", &plain_memory);
  reader.ReadInt("section.inner", &inner);
  reader.ReadString("section.deeper.leaf", &leaf);
  reader.ReadInt("absent", &absent);
  reader.ReadString("section.absent", &absent_string);
  reader.ReadInt("absent_section.key", &absent);
  REQUIRE(reader.Finish().ok());
  CHECK(flag);
  CHECK(count == -3);
  CHECK(ratio == 0.25);
  CHECK(timeout == 1.5);
  CHECK(name == "7100");
  CHECK(names == std::vector<std::string>{"a", "b c"});
  CHECK(block_names == std::vector<std::string>{"x", "y"});
  CHECK(memory == 2LL << 30);
  CHECK(plain_memory == 1000000);
  CHECK(inner == 5);
  CHECK(leaf == "text");
  CHECK(absent == 42);
  CHECK(absent_string == "default");
  CHECK(reader.Has("section.deeper"));
  CHECK_FALSE(reader.Has("absent"));
  CHECK(reader.Line("section.inner") == 14);
  CHECK(reader.Line("absent") == 0);
}

TEST_CASE("YamlReader reports type and bound errors with file, line and dotted key") {
  YamlReader reader = MustParse(
      "a: 1\n"
      "kv_cache:\n"
      "  block_size: abc\n"
      "  count: -2\n"
      "flag: yes\n"
      "ratio: .inf\n"
      "name:\n"
      "list: [a, [b]]\n"
      "memory: -5MiB\n"
      "zero: 0\n");
  int64_t block_size = 16;
  int64_t count = 1;
  int64_t memory = 1;
  int64_t zero = 1;
  bool flag = false;
  double ratio = 1;
  std::string name = "keep";
  std::vector<std::string> list{"keep"};
  reader.ReadInt("kv_cache.block_size", &block_size, Bound::kPositive);
  reader.ReadInt("kv_cache.count", &count, Bound::kNonNegative);
  reader.ReadBool("flag", &flag);
  reader.ReadDouble("ratio", &ratio);
  reader.ReadString("name", &name);
  reader.ReadStringList("list", &list);
  reader.ReadByteSize("memory", &memory);
  reader.ReadByteSize("zero", &zero, Bound::kPositive);
  int64_t a = 0;
  reader.ReadInt("a", &a);
  const std::string message = FinishMessage(reader);
  CHECK_THAT(message,
             Catch::Contains("test.yaml:3: kv_cache.block_size: expected a positive integer, got "
                             "\"abc\""));
  CHECK_THAT(message,
             Catch::Contains("test.yaml:4: kv_cache.count: expected a non-negative integer, got "
                             "\"-2\""));
  CHECK_THAT(message, Catch::Contains("test.yaml:5: flag: expected true or false, got \"yes\""));
  CHECK_THAT(message, Catch::Contains("test.yaml:6: ratio: expected a number"));
  CHECK_THAT(message, Catch::Contains("test.yaml:7: name: expected a string (write \"\" for an "
                                      "empty one), got nothing"));
  CHECK_THAT(message, Catch::Contains("test.yaml:8: list[1]: expected a string, got a sequence"));
  CHECK_THAT(message, Catch::Contains("test.yaml:9: memory: expected a byte size"));
  CHECK_THAT(message,
             Catch::Contains("test.yaml:10: zero: expected a positive byte size, got \"0\""));
  // Failed reads keep the defaults.
  CHECK(block_size == 16);
  CHECK(count == 1);
  CHECK_FALSE(flag);
  CHECK(ratio == 1);
  CHECK(name == "keep");
  CHECK(list == std::vector<std::string>{"keep"});
  CHECK(a == 1);
  // Ordered by line.
  CHECK(message.find("test.yaml:3:") < message.find("test.yaml:10:"));
}

TEST_CASE("YamlReader reports every unknown key with its line, nested ones by full path") {
  YamlReader reader = MustParse(
      "known: 1\n"
      "kv_cache:\n"
      "  block_size: 8\n"
      "  blok_size: 8\n"
      "stray: 2\n"
      "stray_section:\n"
      "  child: 1\n"
      "kv_cache.block_size: 4\n");
  int64_t known = 0;
  int64_t block_size = 0;
  reader.ReadInt("known", &known);
  reader.ReadInt("kv_cache.block_size", &block_size);
  const std::string message = FinishMessage(reader);
  CHECK_THAT(message, Catch::Contains("test.yaml:4: kv_cache.blok_size: unknown key (did you mean "
                                      "'block_size'?)"));
  CHECK_THAT(message, Catch::Contains("test.yaml:5: stray: unknown key"));
  CHECK_THAT(message, Catch::Contains("test.yaml:6: stray_section: unknown key"));
  // Only the unknown section is reported, not each key inside it.
  CHECK_THAT(message, !Catch::Contains("child"));
  // A dotted name at the top level must not pass for the nested key.
  CHECK_THAT(message, Catch::Contains("test.yaml:8: kv_cache.block_size: unknown key (nested keys "
                                      "are written as mappings"));
  CHECK(block_size == 8);
}

TEST_CASE("YamlReader reports duplicate keys, non-mapping sections and non-scalar keys") {
  YamlReader reader = MustParse(
      "port: 1\n"
      "port: 2\n"
      "kv_cache: 5\n"
      "[a, b]: 3\n");
  int64_t port = 0;
  int64_t block_size = 16;
  int64_t memory = 1;
  reader.ReadInt("port", &port);
  reader.ReadInt("kv_cache.block_size", &block_size);
  reader.ReadByteSize("kv_cache.memory_bytes", &memory);
  const std::string message = FinishMessage(reader);
  CHECK_THAT(message, Catch::Contains("test.yaml:2: port: duplicate key (first set on line 1)"));
  CHECK_THAT(message, Catch::Contains("test.yaml:3: kv_cache: expected a mapping, got \"5\""));
  CHECK_THAT(message, Catch::Contains("test.yaml:4: (top level): keys must be plain strings"));
  // The section error is reported once, not once per key read below it.
  const size_t first = message.find("kv_cache:");
  CHECK(message.find("kv_cache:", first + 1) == std::string::npos);
  CHECK(port == 1);
}

TEST_CASE("YamlReader turns syntax errors into statuses with the 1-based line") {
  absl::StatusOr<YamlReader> reader = YamlReader::Parse("a: 1\nb: [1, 2\nc: 3\n", "bad.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK_THAT(std::string(reader.status().message()), Catch::StartsWith("bad.yaml:3: invalid YAML"));

  reader = YamlReader::Parse("a:\n  b: 1\n   c: 2\n", "bad.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK_THAT(std::string(reader.status().message()), Catch::StartsWith("bad.yaml:3: invalid YAML"));

  reader = YamlReader::Parse("a: *missing\n", "bad.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK_THAT(std::string(reader.status().message()), Catch::StartsWith("bad.yaml:1: invalid YAML"));
}

TEST_CASE("YamlReader rejects several documents and a non-mapping top level") {
  absl::StatusOr<YamlReader> reader = YamlReader::Parse("a: 1\n---\nb: 2\n", "multi.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK_THAT(std::string(reader.status().message()),
             Catch::Contains("multi.yaml: expected one YAML document, found 2"));

  reader = YamlReader::Parse("- a\n- b\n", "list.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK_THAT(std::string(reader.status().message()),
             Catch::Contains("list.yaml:1: expected a mapping of keys at the top level"));
}

TEST_CASE("YamlReader treats an empty document and an empty section as all defaults") {
  for (std::string_view yaml : {"", "# only a comment\n", "---\n", "section:\n"}) {
    YamlReader reader = MustParse(yaml);
    int64_t value = 7;
    reader.ReadInt("section.value", &value);
    CHECK(reader.Finish().ok());
    CHECK(value == 7);
  }
}

TEST_CASE("YamlReader::Load reports a missing file, a directory and reads a file") {
  testing::TempDir dir;
  absl::StatusOr<YamlReader> reader = YamlReader::Load(dir.path() / "missing.yaml");
  REQUIRE_FALSE(reader.ok());
  CHECK(reader.status().code() == absl::StatusCode::kNotFound);
  CHECK_THAT(std::string(reader.status().message()), Catch::Contains("missing.yaml"));

  reader = YamlReader::Load(dir.path());
  REQUIRE_FALSE(reader.ok());
  CHECK_THAT(std::string(reader.status().message()), Catch::Contains("not a regular file"));

  const std::filesystem::path file = dir.path() / "ok.yaml";
  testing::WriteBytes(file, "x: 3\ny: oops\n");
  reader = YamlReader::Load(file);
  REQUIRE(reader.ok());
  int64_t x = 0;
  int64_t y = 0;
  reader->ReadInt("x", &x);
  reader->ReadInt("y", &y);
  const absl::Status status = reader->Finish();
  CHECK(x == 3);
  CHECK_THAT(std::string(status.message()),
             Catch::StartsWith(file.string() + ":2: y: expected an integer"));
}

TEST_CASE("ConfigErrors without a source formats key: message and caps the list") {
  ConfigErrors errors;
  CHECK(errors.ToStatus().ok());
  errors.Add("bundle", 0, "required");
  CHECK(errors.ToStatus().message() == "bundle: required");
  for (int i = 0; i < 30; ++i) errors.Add("k", 0, "bad");
  CHECK_THAT(std::string(errors.ToStatus().message()), Catch::EndsWith("(and 11 more errors)"));
}

}  // namespace
}  // namespace tophat

namespace tophat {
namespace {

TEST_CASE("YamlReader refuses control characters, naming line and column") {
  // Found by fuzz/yaml_config_fuzzer: yaml-cpp 0.7 allocated without end on a NUL inside an
  // unclosed quoted scalar (this input), so control characters never reach it.
  const std::string yaml("log_level: info\n, \"0.\0\n", 23);
  auto parsed = YamlReader::Parse(yaml, "cloud.yaml");
  REQUIRE_FALSE(parsed.ok());
  CHECK(parsed.status().code() == absl::StatusCode::kInvalidArgument);
  CHECK(std::string(parsed.status().message()) ==
        "cloud.yaml:2: invalid YAML (column 6): control character 0x00 is not allowed");
  // Tabs and CRLF line ends are YAML.
  CHECK(YamlReader::Parse("a: 1\r\nb:\t2\r\n", "crlf.yaml").ok());
}

TEST_CASE("YamlReader refuses a stream yaml-cpp would loop on, naming line and column") {
  // Found by fuzz/yaml_config_fuzzer: on a document whose first token starts no node (a ','
  // here), yaml-cpp 0.7's YAML::LoadAll loops allocating until memory runs out (27 s and
  // 4 GB on the fuzzer's input).
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"# a comment\n\n, Every value\nb: 1\n", "agent.yaml:3: invalid YAML (column 1)"},
      {"  , x\n", "agent.yaml:1: invalid YAML (column 3)"},
      {"---\n,\n", "agent.yaml:2: invalid YAML (column 1)"},
      {"%YAML 1.2\n--- , x\n", "agent.yaml:2: invalid YAML (column 5)"},
      {"a: 1\n---\n# c\n\t, x\n", "agent.yaml:4: invalid YAML (column 2)"},
      // The same loop after the root node's properties (the fuzzer's second input began
      // "&bab2, 4,,"): an anchor, a tag, both, across a line break and a comment.
      {"&bab2, 4,,x 8, 5@]\n", "agent.yaml:1: invalid YAML (column 6)"},
      {"&a ,\n", "agent.yaml:1: invalid YAML (column 4)"},
      {"!t,\n", "agent.yaml:1: invalid YAML (column 3)"},
      {"!!str ,\n", "agent.yaml:1: invalid YAML (column 7)"},
      {"!<tag:x,y> ,\n", "agent.yaml:1: invalid YAML (column 12)"},
      {"--- &a !t ,\n", "agent.yaml:1: invalid YAML (column 11)"},
      {"&a # c\n\n  , x\n", "agent.yaml:3: invalid YAML (column 3)"},
      // The same loop on a later document: after a quoted scalar, after a block scalar and
      // a flow sequence, and after a document whose `---` a tag made a scalar.
      {"\"q\",\n", "agent.yaml:1: invalid YAML (column 4)"},
      {"|\n  text\n, x\n", "agent.yaml:3: invalid YAML (column 1)"},
      {"[1, 2]\n, 3\n", "agent.yaml:2: invalid YAML (column 1)"},
  };
  for (const auto& [yaml, where] : refused) {
    INFO(yaml);
    auto parsed = YamlReader::Parse(yaml, "agent.yaml");
    REQUIRE_FALSE(parsed.ok());
    CHECK_THAT(std::string(parsed.status().message()),
               Catch::StartsWith(where + ": no node starts with ',' here"));
  }
  // Other tokens start the loop too: a '?' after a tagged document.
  for (const auto& [yaml, where] : std::vector<std::pair<std::string, std::string>>{
           {"!t ---\n? x\n", "agent.yaml:2: invalid YAML (column 1)"},
           {"!t |\n? \n", "agent.yaml:2: invalid YAML (column 1)"},
       }) {
    INFO(yaml);
    auto parsed = YamlReader::Parse(yaml, "agent.yaml");
    REQUIRE_FALSE(parsed.ok());
    CHECK(std::string(parsed.status().message()) == where + ": no node starts with '?' here");
  }
  // Commas anywhere else are YAML's business (and yaml-cpp's errors), and properties before
  // anything but a comma are YAML.
  CHECK(YamlReader::Parse("a: [1, 2]\nb: \"x, y\"\n# , comment\n", "ok.yaml").ok());
  CHECK(YamlReader::Parse("&root\na: 1\n", "anchored.yaml").ok());
  CHECK(YamlReader::Parse("--- !!map\na: 1\n", "tagged.yaml").ok());
  auto later = YamlReader::Parse("a: 1\n, b\n", "later.yaml");
  REQUIRE_FALSE(later.ok());
  CHECK_THAT(std::string(later.status().message()), Catch::Contains("later.yaml:2"));
}

TEST_CASE("YamlReader::Values names every value by its dotted key, lists in flow form") {
  YamlReader reader = MustParse(
      "a: 1\n"
      "tls:\n"
      "  tokens: [\"x:1\", y]\n"
      "  nested:\n"
      "    deep: \"quoted\"\n"
      "empty:\n"
      "block:\n"
      "  - 1\n"
      "  - 2\n");
  const std::map<std::string, std::string> values = reader.Values();
  CHECK(values == std::map<std::string, std::string>{{"a", "1"},
                                                     {"tls.tokens", "[x:1, y]"},
                                                     {"tls.nested.deep", "quoted"},
                                                     {"empty", "~"},
                                                     {"block", "[1, 2]"}});
}

TEST_CASE("ChangedConfigKeys finds changed, added and removed keys, and which wait for a restart") {
  const std::map<std::string, std::string> before = {
      {"a", "1"}, {"b", "2"}, {"log_level", "info"}, {"tls.device_tokens", "[x]"}};
  const std::map<std::string, std::string> after = {
      {"a", "1"}, {"c", "3"}, {"log_level", "debug"}, {"tls.device_tokens", "[y]"}};
  CHECK(ChangedConfigKeys(before, after) ==
        std::vector<std::string>{"b", "c", "log_level", "tls.device_tokens"});
  CHECK(ChangedConfigKeys(before, before).empty());
  constexpr std::string_view kReloaded[] = {"tls.device_tokens", "log_level"};
  CHECK(KeysAwaitingRestart(before, after, kReloaded) == std::vector<std::string>{"b", "c"});
  // A value written differently but read the same ("1" and 1) is no change.
  CHECK(ChangedConfigKeys(MustParse("a: 1\n").Values(), MustParse("a: \"1\"\n").Values()).empty());
}

}  // namespace
}  // namespace tophat
