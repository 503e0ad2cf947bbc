#include "device_agent/kept_files.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

// What a file holds besides the object, so that a later format can tell this one apart.
constexpr char kFormat[] = "tophat-kept-object/1";
constexpr std::string_view kSuffix = ".json";
constexpr std::string_view kTemporarySuffix = ".json.tmp";
constexpr std::string_view kUnreadableSuffix = ".unreadable";

std::string ErrnoText(int err) { return std::strerror(err); }

bool IsFileId(const std::string& id) {
  return !id.empty() && id.size() <= 128 && std::all_of(id.begin(), id.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
           c == '-';
  });
}

absl::Status CheckId(const std::string& id) {
  if (IsFileId(id)) return absl::OkStatus();
  return absl::InvalidArgumentError(absl::StrCat(
      "kept object id \"", id.substr(0, 64), "\" cannot name a file (1 to 128 of [A-Za-z0-9_-])"));
}

// A rename or an unlink lasts through a power loss only once the folder is synced.
absl::Status SyncFolder(const fs::path& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) {
    return absl::InternalError(absl::StrCat(dir.string(), ": cannot open: ", ErrnoText(errno)));
  }
  const int synced = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  if (synced != 0) {
    return absl::InternalError(absl::StrCat(dir.string(), ": fsync failed: ", ErrnoText(err)));
  }
  return absl::OkStatus();
}

bool EndsWith(const std::string& name, std::string_view suffix) {
  return name.size() >= suffix.size() &&
         name.compare(name.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The object a file holds, or why it cannot be read back.
absl::StatusOr<KeptFiles::Object> ReadObject(const fs::path& path, const std::string& id) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return absl::NotFoundError(absl::StrCat("cannot open: ", ErrnoText(errno)));
  std::ostringstream text;
  text << in.rdbuf();
  if (in.bad()) return absl::DataLossError(absl::StrCat("cannot read: ", ErrnoText(errno)));
  const KeptFiles::Json file = KeptFiles::Json::parse(text.str(), nullptr, false);
  if (file.is_discarded() || !file.is_object()) {
    return absl::DataLossError("not a JSON object");
  }
  const auto format = file.find("format");
  if (format == file.end() || !format->is_string() || *format != kFormat) {
    return absl::DataLossError(absl::StrCat("\"format\" is not \"", kFormat, "\""));
  }
  const auto file_id = file.find("id");
  if (file_id == file.end() || !file_id->is_string() || *file_id != id) {
    return absl::DataLossError(absl::StrCat("\"id\" is not \"", id, "\", the file's name"));
  }
  const auto app = file.find("app");
  if (app == file.end() || !app->is_string()) {
    return absl::DataLossError("\"app\" is missing or not a string");
  }
  const auto value = file.find("value");
  if (value == file.end()) return absl::DataLossError("\"value\" is missing");
  return KeptFiles::Object{.id = id, .app = app->get<std::string>(), .value = *value};
}

}  // namespace

absl::StatusOr<FolderLock> FolderLock::Take(const fs::path& dir) {
  absl::StatusOr<KeptFiles> folder = KeptFiles::Open(dir);
  if (!folder.ok()) return folder.status();
  const fs::path path = dir / ".lock";
  const int fd = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), ": cannot open: ", ErrnoText(errno)));
  }
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    // The holder wrote its pid; read what is there (it may be mid-write: then no pid).
    char pid[32] = {};
    const ssize_t n = ::pread(fd, pid, sizeof(pid) - 1, 0);
    ::close(fd);
    const std::string holder =
        n > 0 ? absl::StrCat(" (pid ", std::string(pid, static_cast<size_t>(n)), ")") : "";
    if (err == EWOULDBLOCK) {
      return absl::FailedPreconditionError(
          absl::StrCat(dir.string(), ": in use by another process", holder,
                       ": two agents cannot share one store folder"));
    }
    return absl::FailedPreconditionError(
        absl::StrCat(path.string(), ": cannot lock: ", ErrnoText(err)));
  }
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd, 0) != 0 || ::pwrite(fd, pid.data(), pid.size(), 0) < 0) {
    // The pid is for a person reading a refusal; the lock holds without it.
  }
  return FolderLock(fd);
}

FolderLock& FolderLock::operator=(FolderLock&& other) noexcept {
  if (this != &other) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(other.fd_, -1);
  }
  return *this;
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);
}

absl::StatusOr<KeptFiles> KeptFiles::Open(fs::path dir) {
  std::error_code ec;
  // The folders it makes (the store's and those above it) are the agent's alone:
  // conversations are the apps' text.
  std::vector<fs::path> missing;
  for (fs::path at = dir; !at.empty() && !fs::exists(at, ec); at = at.parent_path()) {
    missing.push_back(at);
    if (at == at.parent_path()) break;
  }
  for (auto at = missing.rbegin(); at != missing.rend(); ++at) {
    if (::mkdir(at->c_str(), 0700) != 0 && errno != EEXIST) {
      return absl::FailedPreconditionError(absl::StrCat(dir.string(), ": cannot make the folder ",
                                                        at->string(), ": ", ErrnoText(errno)));
    }
  }
  if (!fs::is_directory(dir, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(dir.string(), ": not a folder"));
  }
  if (::access(dir.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(
        absl::StrCat(dir.string(), ": cannot write in it: ", ErrnoText(errno)));
  }
  return KeptFiles(std::move(dir));
}

absl::StatusOr<size_t> KeptFiles::Check(const fs::path& dir) {
  std::error_code ec;
  fs::path at = dir;
  while (!at.empty() && !fs::exists(at, ec) && at != at.parent_path()) at = at.parent_path();
  if (at.empty()) at = ".";
  if (!fs::is_directory(at, ec)) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.string(),
        at == dir ? ": not a folder" : absl::StrCat(": ", at.string(), " is not a folder")));
  }
  if (::access(at.c_str(), W_OK | X_OK) != 0) {
    return absl::FailedPreconditionError(absl::StrCat(
        dir.string(), at == dir ? "" : absl::StrCat(": cannot make it in ", at.string()),
        ": cannot write in it: ", ErrnoText(errno)));
  }
  if (at != dir) return 0;
  size_t files = 0;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir, ec)) {
    if (EndsWith(entry.path().filename().string(), kSuffix)) ++files;
  }
  return files;
}

fs::path KeptFiles::FileOf(const std::string& id) const {
  return dir_ / (id + std::string(kSuffix));
}

KeptFiles::Loaded KeptFiles::Load() const {
  struct Found {
    fs::file_time_type written;
    fs::path path;
    std::string id;
  };
  std::vector<Found> found;
  Loaded loaded;
  std::error_code ec;
  for (const fs::directory_entry& entry : fs::directory_iterator(dir_, ec)) {
    const std::string name = entry.path().filename().string();
    if (EndsWith(name, kTemporarySuffix)) {
      // A write a crash cut short; the file it was to replace, if any, is whole.
      fs::remove(entry.path(), ec);
      continue;
    }
    if (!EndsWith(name, kSuffix) || !entry.is_regular_file(ec)) continue;
    const std::string id = name.substr(0, name.size() - kSuffix.size());
    const fs::file_time_type written = entry.last_write_time(ec);
    found.push_back(
        {.written = ec ? fs::file_time_type::min() : written, .path = entry.path(), .id = id});
  }
  if (ec) {
    loaded.unreadable.push_back(absl::StrCat(dir_.string(), ": cannot list: ", ec.message()));
  }
  std::sort(found.begin(), found.end(), [](const Found& a, const Found& b) {
    return a.written != b.written ? a.written < b.written : a.id < b.id;
  });
  for (Found& file : found) {
    absl::StatusOr<Object> object =
        IsFileId(file.id) ? ReadObject(file.path, file.id)
                          : absl::StatusOr<Object>(absl::DataLossError("not a kept object's name"));
    if (object.ok()) {
      loaded.objects.push_back(*std::move(object));
      continue;
    }
    loaded.unreadable.push_back(SetAsideFile(file.path, std::string(object.status().message())));
  }
  return loaded;
}

std::string KeptFiles::SetAside(const std::string& id, std::string_view why) const {
  return SetAsideFile(FileOf(id), why);
}

std::string KeptFiles::SetAsideFile(const fs::path& path, std::string_view why) {
  fs::path aside = path;
  aside += kUnreadableSuffix;
  std::error_code ec;
  fs::rename(path, aside, ec);
  return absl::StrCat(path.string(), ": ", std::string(why),
                      ec ? absl::StrCat(" (could not move it aside: ", ec.message(), ")")
                         : absl::StrCat(" (moved to ", aside.filename().string(), ")"));
}

absl::Status KeptFiles::Write(const std::string& id, const std::string& app,
                              const Json& value) const {
  if (absl::Status checked = CheckId(id); !checked.ok()) return checked;
  const Json file{{"format", kFormat}, {"id", id}, {"app", app}, {"value", value}};
  // Generated text may end inside a character; the file keeps it as the endpoint shows it.
  const std::string text = file.dump(-1, ' ', false, Json::error_handler_t::replace);
  const fs::path path = FileOf(id);
  fs::path temporary = dir_ / (id + std::string(kTemporarySuffix));
  const int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
  if (fd < 0) {
    return absl::InternalError(
        absl::StrCat(temporary.string(), ": cannot create: ", ErrnoText(errno)));
  }
  auto fail = [&](const char* what, int err) {
    ::close(fd);
    ::unlink(temporary.c_str());
    return absl::InternalError(
        absl::StrCat(temporary.string(), ": ", what, " failed: ", ErrnoText(err)));
  };
  size_t written = 0;
  while (written < text.size()) {
    const ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return fail("write", errno);
    written += static_cast<size_t>(n);
  }
  if (::fsync(fd) != 0) return fail("fsync", errno);
  if (::close(fd) != 0) {
    const int err = errno;
    ::unlink(temporary.c_str());
    return absl::InternalError(
        absl::StrCat(temporary.string(), ": close failed: ", ErrnoText(err)));
  }
  std::error_code ec;
  fs::rename(temporary, path, ec);
  if (ec) {
    ::unlink(temporary.c_str());
    return absl::InternalError(absl::StrCat(path.string(), ": cannot rename ",
                                            temporary.filename().string(),
                                            " over it: ", ec.message()));
  }
  return SyncFolder(dir_);
}

absl::Status KeptFiles::Touch(const std::string& id) const {
  if (absl::Status checked = CheckId(id); !checked.ok()) return checked;
  const fs::path path = FileOf(id);
  // utimensat with null times: now, by the file system's clock, as a write would set it.
  if (::utimensat(AT_FDCWD, path.c_str(), nullptr, 0) != 0 && errno != ENOENT) {
    return absl::InternalError(
        absl::StrCat(path.string(), ": cannot mark as used: ", ErrnoText(errno)));
  }
  return absl::OkStatus();
}

absl::Status KeptFiles::Remove(const std::string& id) const {
  if (absl::Status checked = CheckId(id); !checked.ok()) return checked;
  const fs::path path = FileOf(id);
  if (::unlink(path.c_str()) != 0) {
    if (errno == ENOENT) return absl::OkStatus();
    return absl::InternalError(absl::StrCat(path.string(), ": cannot remove: ", ErrnoText(errno)));
  }
  return SyncFolder(dir_);
}

}  // namespace tophat
