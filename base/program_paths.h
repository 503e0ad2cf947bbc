// Where a program finds the files that ship beside it, with no path of the machine that
// built it compiled in: in the folders above its own, as an install (/usr/bin -> /usr/lib),
// a build tree (build/release/bin -> the sources) and an unpacked GPU bundle lay them out.
#pragma once

#include <filesystem>
#include <system_error>
#include <vector>

namespace tophat {

// The running program's own folder, then each folder above it up to the root; empty when
// /proc/self/exe cannot be read.
inline std::vector<std::filesystem::path> FoldersAboveProgram() {
  std::vector<std::filesystem::path> folders;
  std::error_code ec;
  const std::filesystem::path self = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) return folders;
  for (std::filesystem::path dir = self.parent_path(); !dir.empty(); dir = dir.parent_path()) {
    folders.push_back(dir);
    if (dir == dir.root_path()) break;
  }
  return folders;
}

}  // namespace tophat
