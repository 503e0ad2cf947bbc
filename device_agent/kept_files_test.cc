#include "device_agent/kept_files.h"

#include <sys/stat.h>
#include <unistd.h>

#include <catch2/catch.hpp>
#include <chrono>
#include <filesystem>
#include <optional>
#include <string>

#include "base/test_util.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;
using Json = nlohmann::ordered_json;
using testing::ReadBytes;
using testing::TempDir;
using testing::WriteBytes;

mode_t ModeOf(const fs::path& path) {
  struct stat info {};
  REQUIRE(::stat(path.c_str(), &info) == 0);
  return info.st_mode & 0777;
}

TEST_CASE("Kept files come back as written, the least recently written first") {
  TempDir temp;
  const fs::path dir = temp.path() / "store" / "responses";
  absl::StatusOr<KeptFiles> files = KeptFiles::Open(dir);
  REQUIRE(files.ok());
  // Made, with the folder above it, and the agent's alone: the files are apps' text.
  CHECK(ModeOf(dir) == 0700);
  CHECK(ModeOf(dir.parent_path()) == 0700);
  REQUIRE(files->Write("resp_b", "app-1", Json{{"text", "second"}}).ok());
  REQUIRE(files->Write("resp_a", "", Json{{"text", "first"}, {"n", 1}}).ok());
  REQUIRE(files->Write("conv_c", "app-2", Json::array({1, 2})).ok());
  CHECK(ModeOf(files->FileOf("resp_b")) == 0600);
  // Written in this order, whatever the clock's resolution.
  const auto now = fs::file_time_type::clock::now();
  fs::last_write_time(files->FileOf("resp_a"), now - std::chrono::seconds(30));
  fs::last_write_time(files->FileOf("resp_b"), now - std::chrono::seconds(20));
  fs::last_write_time(files->FileOf("conv_c"), now - std::chrono::seconds(10));
  // Rewritten: the newest.
  REQUIRE(files->Write("resp_a", "", Json{{"text", "first, again"}}).ok());

  KeptFiles::Loaded loaded = files->Load();
  CHECK(loaded.unreadable.empty());
  REQUIRE(loaded.objects.size() == 3);
  CHECK(loaded.objects[0].id == "resp_b");
  CHECK(loaded.objects[0].app == "app-1");
  CHECK(loaded.objects[0].value == Json{{"text", "second"}});
  CHECK(loaded.objects[1].id == "conv_c");
  CHECK(loaded.objects[1].value == Json::array({1, 2}));
  CHECK(loaded.objects[2].id == "resp_a");
  CHECK(loaded.objects[2].app.empty());
  CHECK(loaded.objects[2].value == Json{{"text", "first, again"}});

  // Used (Touch): the most recent, whatever was written since.
  REQUIRE(files->Touch("resp_b").ok());
  loaded = files->Load();
  REQUIRE(loaded.objects.size() == 3);
  CHECK(loaded.objects[2].id == "resp_b");
  CHECK(loaded.objects[2].value == Json{{"text", "second"}});  // unchanged
  CHECK(files->Touch("resp_gone").ok());                       // a file that is not there: no error
  CHECK_FALSE(fs::exists(files->FileOf("resp_gone")));

  REQUIRE(files->Remove("resp_b").ok());
  CHECK_FALSE(fs::exists(files->FileOf("resp_b")));
  // Gone already: no error.
  CHECK(files->Remove("resp_b").ok());
  CHECK(files->Load().objects.size() == 2);
  // Opening it again finds the same.
  absl::StatusOr<KeptFiles> again = KeptFiles::Open(dir);
  REQUIRE(again.ok());
  CHECK(again->Load().objects.size() == 2);
}

TEST_CASE("Kept files refuse ids that are not plain names") {
  TempDir temp;
  absl::StatusOr<KeptFiles> files = KeptFiles::Open(temp.path());
  REQUIRE(files.ok());
  for (const std::string& id :
       std::vector<std::string>{"", "../escape", "a/b", "resp_.json", std::string(129, 'a')}) {
    const absl::Status written = files->Write(id, "app", Json::object());
    CHECK(absl::IsInvalidArgument(written));
    CHECK_THAT(std::string(written.message()), Catch::Contains("cannot name a file"));
    CHECK(absl::IsInvalidArgument(files->Remove(id)));
  }
  CHECK(fs::is_empty(temp.path()));
  CHECK(files->Write(std::string(128, 'a'), "app", Json::object()).ok());
}

TEST_CASE("A kept file that cannot be read back is set aside, named, and the rest load") {
  TempDir temp;
  absl::StatusOr<KeptFiles> files = KeptFiles::Open(temp.path());
  REQUIRE(files.ok());
  REQUIRE(files->Write("resp_good", "app", Json{{"ok", true}}).ok());
  WriteBytes(files->FileOf("resp_torn"), R"({"format": "tophat-kept-object/1", "id": "resp_t)");
  WriteBytes(files->FileOf("resp_other"),
             R"({"format": "tophat-kept-object/1", "id": "resp_x", "app": "", "value": 1})");
  WriteBytes(files->FileOf("resp_later"),
             R"({"format": "tophat-kept-object/2", "id": "resp_later", "app": "", "value": 1})");
  WriteBytes(files->FileOf("resp_noapp"),
             R"({"format": "tophat-kept-object/1", "id": "resp_noapp", "value": 1})");
  WriteBytes(files->FileOf("bad.name"), "{}");
  // A write a crash cut short, and files that are not kept objects.
  WriteBytes(temp.path() / "resp_cut.json.tmp", R"({"format": "tophat-ke)");
  WriteBytes(temp.path() / "README", "not mine");

  KeptFiles::Loaded loaded = files->Load();
  REQUIRE(loaded.objects.size() == 1);
  CHECK(loaded.objects[0].id == "resp_good");
  REQUIRE(loaded.unreadable.size() == 5);
  std::string all;
  for (const std::string& why : loaded.unreadable) all += why + "\n";
  CHECK_THAT(all, Catch::Contains("resp_torn.json: not a JSON object (moved to "
                                  "resp_torn.json.unreadable)"));
  CHECK_THAT(all, Catch::Contains("resp_other.json: \"id\" is not \"resp_other\""));
  CHECK_THAT(all, Catch::Contains("resp_later.json: \"format\" is not \"tophat-kept-object/1\""));
  CHECK_THAT(all, Catch::Contains("resp_noapp.json: \"app\" is missing"));
  CHECK_THAT(all, Catch::Contains("bad.name.json: not a kept object's name"));
  CHECK(fs::exists(temp.path() / "resp_torn.json.unreadable"));
  CHECK_FALSE(fs::exists(temp.path() / "resp_cut.json.tmp"));
  CHECK(ReadBytes(temp.path() / "README") == "not mine");
  // Set aside once: the next start reads only the good one, and says nothing more.
  KeptFiles::Loaded again = files->Load();
  CHECK(again.objects.size() == 1);
  CHECK(again.unreadable.empty());

  // One its owner cannot use, set aside the same way.
  const std::string why = files->SetAside("resp_good", "not a kept response");
  CHECK_THAT(why, Catch::Contains("resp_good.json: not a kept response (moved to "
                                  "resp_good.json.unreadable)"));
  CHECK(files->Load().objects.empty());
}

TEST_CASE("Kept files' folder must be one the agent can write in") {
  TempDir temp;
  // Checked without a change: a folder to make counts no files, and is not made.
  CHECK(KeptFiles::Check(temp.path() / "a" / "b").value() == 0);
  CHECK_FALSE(fs::exists(temp.path() / "a"));
  REQUIRE(KeptFiles::Open(temp.path() / "kept").value().Write("resp_1", "", 1).ok());
  CHECK(KeptFiles::Check(temp.path() / "kept").value() == 1);
  WriteBytes(temp.path() / "file", "");
  absl::StatusOr<KeptFiles> not_folder = KeptFiles::Open(temp.path() / "file");
  CHECK(absl::IsFailedPrecondition(not_folder.status()));
  CHECK_THAT(std::string(not_folder.status().message()),
             Catch::Contains((temp.path() / "file").string()));
  absl::StatusOr<KeptFiles> under_file = KeptFiles::Open(temp.path() / "file" / "store");
  CHECK_THAT(std::string(under_file.status().message()), Catch::Contains("cannot make the folder"));
  CHECK_THAT(std::string(KeptFiles::Check(temp.path() / "file" / "store").status().message()),
             Catch::Contains((temp.path() / "file").string() + " is not a folder"));
  CHECK(absl::IsFailedPrecondition(KeptFiles::Check(temp.path() / "file").status()));
  if (::geteuid() != 0) {
    // Root writes anywhere.
    fs::create_directory(temp.path() / "read-only");
    fs::permissions(temp.path() / "read-only", fs::perms::owner_read | fs::perms::owner_exec);
    absl::StatusOr<KeptFiles> read_only = KeptFiles::Open(temp.path() / "read-only");
    CHECK_THAT(std::string(read_only.status().message()), Catch::Contains("cannot write in it"));
    CHECK_THAT(std::string(KeptFiles::Check(temp.path() / "read-only" / "x").status().message()),
               Catch::Contains("cannot write in it"));
    fs::permissions(temp.path() / "read-only", fs::perms::owner_all);
  }
}

TEST_CASE("One process at a time holds a store folder") {
  TempDir temp;
  const fs::path dir = temp.path() / "store";
  std::optional<absl::StatusOr<FolderLock>> first = FolderLock::Take(dir);
  REQUIRE(first->ok());
  CHECK(ModeOf(dir) == 0700);
  // A second holder (here another open file in the same process, which flock treats as
  // another process would be) is refused, naming the folder and who holds it.
  absl::StatusOr<FolderLock> second = FolderLock::Take(dir);
  CHECK(absl::IsFailedPrecondition(second.status()));
  CHECK_THAT(std::string(second.status().message()),
             Catch::Contains(dir.string() + ": in use by another process (pid " +
                             std::to_string(::getpid()) + ")"));
  // Let go, it can be taken again; moved, it is still held.
  first.reset();
  absl::StatusOr<FolderLock> third = FolderLock::Take(dir);
  REQUIRE(third.ok());
  FolderLock moved = *std::move(third);
  CHECK_FALSE(FolderLock::Take(dir).ok());
}

}  // namespace
}  // namespace tophat
