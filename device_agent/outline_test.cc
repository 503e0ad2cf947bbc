#include "device_agent/outline.h"

#include <catch2/catch.hpp>

#include <thread>

namespace tophat {
namespace {

const std::vector<std::string> kNumberWords = {"one", "two", "three", "four", "five"};

TEST_CASE("An outline's points are found by their labels, in order", "[outline]") {
  auto points = ParseOutline(" one cat two robot three baker .", kNumberWords, " .", 8);
  REQUIRE(points.size() == 3);
  CHECK(points[0].label == "one");
  CHECK(points[0].text == "cat");
  CHECK(points[1].text == "robot");
  CHECK(points[2].label == "three");
  CHECK(points[2].text == "baker");

  // What follows the stop is not the outline's.
  points = ParseOutline("one cat two dog . point one cat : three", kNumberWords, ".", 8);
  REQUIRE(points.size() == 2);
  CHECK(points[1].text == "dog");

  // A label inside a word is not a label; at most max_points.
  points = ParseOutline("one someone two lonely three x", kNumberWords, ".", 2);
  REQUIRE(points.size() == 2);
  CHECK(points[0].text == "someone");
  CHECK(points[1].text == "lonely");  // up to the third label, whose point is left out

  // Numbered lines, as a larger model writes them.
  const std::vector<std::string> numbered = {"1.", "2.", "3."};
  points = ParseOutline("1. Preheat the oven\n2. Mix the batter\n3. Bake\n\n", numbered,
                        "\n\n", 8);
  REQUIRE(points.size() == 3);
  CHECK(points[1].text == "Mix the batter");
}

TEST_CASE("An outline that does not parse has fewer than two points", "[outline]") {
  CHECK(ParseOutline("the cat chased the mouse .", kNumberWords, ".", 8).empty());
  CHECK(ParseOutline("one two three", kNumberWords, ".", 8).empty());  // empty point texts
  CHECK(ParseOutline("two cat three dog", kNumberWords, ".", 8).empty());  // starts at two
  CHECK(ParseOutline("one cat three dog", kNumberWords, ".", 8).size() == 1);
  CHECK(ParseOutline("", kNumberWords, ".", 8).empty());
  CHECK(ParseOutline("one cat two dog", {}, ".", 8).empty());
}

TEST_CASE("A point's marker names its label and text", "[outline]") {
  CHECK(ExpandMarker(" point {label} {point} :", {.label = "two", .text = "robot"}) ==
        " point two robot :");
  CHECK(ExpandMarker("\n## {point}\n", {.label = "1.", .text = "Mix"}) == "\n## Mix\n");
}

TEST_CASE("Points stream in point order while they are produced concurrently", "[outline]") {
  std::string out;
  InOrderStream stream(3, [&](std::span<const int32_t> ids, const std::string& text) {
    out += text;
    CHECK(ids.size() == text.size());  // one id per character below
    return true;
  });
  CHECK(stream.Push(1, std::vector<int32_t>{1, 1}, "b1"));  // held: point 0 runs
  CHECK(stream.Push(2, std::vector<int32_t>{2, 2}, "c1"));
  CHECK(out.empty());
  CHECK(stream.Push(0, std::vector<int32_t>{0, 0}, "a1"));
  CHECK(out == "a1");
  stream.Finish(2);  // finished early, still held behind point 1
  CHECK(out == "a1");
  stream.Finish(0);  // point 1's held piece follows at once
  CHECK(out == "a1b1");
  CHECK(stream.Push(1, std::vector<int32_t>{1, 1}, "b2"));
  CHECK(out == "a1b1b2");
  stream.Finish(1);  // point 2, finished, all at once
  CHECK(out == "a1b1b2c1");

  // From threads: whatever the interleaving, the order is the points'.
  std::string threaded;
  InOrderStream concurrent(4, [&](std::span<const int32_t>, const std::string& text) {
    threaded += text;
    return true;
  });
  std::vector<std::thread> threads;
  for (size_t p = 0; p < 4; ++p) {
    threads.emplace_back([&concurrent, p] {
      for (int i = 0; i < 50; ++i) {
        concurrent.Push(p, {}, std::string(1, static_cast<char>('a' + p)));
      }
      concurrent.Finish(p);
    });
  }
  for (std::thread& t : threads) t.join();
  CHECK(threaded == std::string(50, 'a') + std::string(50, 'b') + std::string(50, 'c') +
                        std::string(50, 'd'));
}

TEST_CASE("A sink that refuses stops every point", "[outline]") {
  int calls = 0;
  InOrderStream stream(2, [&](std::span<const int32_t>, const std::string&) {
    ++calls;
    return false;
  });
  CHECK_FALSE(stream.Push(0, {}, "x"));
  CHECK(stream.stopped());
  CHECK_FALSE(stream.Push(1, {}, "y"));
  stream.Finish(0);
  stream.Finish(1);
  CHECK(calls == 1);
}

}  // namespace
}  // namespace tophat
