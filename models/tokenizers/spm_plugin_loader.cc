#include "models/tokenizers/spm_plugin_loader.h"

#include <dlfcn.h>

#include <cstdlib>
#include <system_error>
#include <utility>

#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "base/program_paths.h"
#include "models/tokenizers/spm_plugin_api.h"

namespace tophat {
namespace {

namespace fs = std::filesystem;

constexpr const char* kPluginName = "libtophat_spm_plugin.so";

struct Plugin {
  decltype(&tophat_spm_load) load = nullptr;
  decltype(&tophat_spm_free) free_model = nullptr;
  decltype(&tophat_spm_encode) encode = nullptr;
  decltype(&tophat_spm_decode) decode = nullptr;
  decltype(&tophat_spm_piece_size) piece_size = nullptr;
  decltype(&tophat_spm_bos_id) bos_id = nullptr;
  decltype(&tophat_spm_eos_id) eos_id = nullptr;
  decltype(&tophat_spm_is_control) is_control = nullptr;
  decltype(&tophat_spm_id_to_piece) id_to_piece = nullptr;
  decltype(&tophat_spm_piece_to_id) piece_to_id = nullptr;
  decltype(&tophat_spm_train_bpe) train_bpe = nullptr;
  decltype(&tophat_spm_free_buffer) free_buffer = nullptr;
};

std::vector<fs::path> CandidatePaths() {
  std::vector<fs::path> paths;
  // Beside the program, then in lib/tophat/ or bin/ of each folder above it: an install
  // (/usr/bin -> /usr/lib/tophat), the build tree (a unit test in build/release/models/...
  // -> build/release/bin) and an unpacked GPU bundle alike.
  for (const fs::path& dir : FoldersAboveProgram()) {
    paths.push_back(dir / kPluginName);
    paths.push_back(dir / "lib" / "tophat" / kPluginName);
    paths.push_back(dir / "bin" / kPluginName);
  }
  return paths;
}

// AddressSanitizer and ThreadSanitizer abort a process that dlopen()s with RTLD_DEEPBIND
// (their interceptors must see every call). Under them the plugin goes into a link namespace
// of its own instead: it and libsentencepiece get their own libstdc++ and libc there, so
// nothing they bind to is ours. Sanitizer builds compile the plugin uninstrumented for this
// (a second sanitizer runtime in that namespace would not start). Only plain C types and
// buffers the plugin frees itself cross the boundary, which both ways need.
bool UnderSanitizerRuntime() {
  return dlsym(RTLD_DEFAULT, "__asan_init") != nullptr ||
         dlsym(RTLD_DEFAULT, "__tsan_init") != nullptr;
}

void* OpenLibrary(const fs::path& path) {
  if (UnderSanitizerRuntime()) return dlmopen(LM_ID_NEWLM, path.c_str(), RTLD_NOW | RTLD_LOCAL);
  return dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_DEEPBIND);
}

absl::StatusOr<Plugin> OpenPlugin() {
  const std::vector<fs::path> candidates = CandidatePaths();
  std::vector<std::string> tried;
  void* handle = nullptr;
  fs::path opened;
  for (const fs::path& path : candidates) {
    std::error_code ec;
    if (!fs::is_regular_file(path, ec)) {
      tried.push_back(absl::StrCat(path.string(), " (not found)"));
      continue;
    }
    handle = OpenLibrary(path);
    if (handle != nullptr) {
      opened = path;
      break;
    }
    const char* error = dlerror();
    tried.push_back(absl::StrCat(path.string(), " (", error != nullptr ? error : "dlopen failed",
                                 ")"));
  }
  if (handle == nullptr) {
    return absl::NotFoundError(absl::StrCat("cannot load the SentencePiece plugin ", kPluginName,
                                            "; tried: ", absl::StrJoin(tried, ", ")));
  }
  Plugin plugin;
  std::vector<std::string> missing;
  const auto bind = [&](auto& fn, const char* name) {
    fn = reinterpret_cast<std::remove_reference_t<decltype(fn)>>(dlsym(handle, name));
    if (fn == nullptr) missing.emplace_back(name);
  };
  bind(plugin.load, "tophat_spm_load");
  bind(plugin.free_model, "tophat_spm_free");
  bind(plugin.encode, "tophat_spm_encode");
  bind(plugin.decode, "tophat_spm_decode");
  bind(plugin.piece_size, "tophat_spm_piece_size");
  bind(plugin.bos_id, "tophat_spm_bos_id");
  bind(plugin.eos_id, "tophat_spm_eos_id");
  bind(plugin.is_control, "tophat_spm_is_control");
  bind(plugin.id_to_piece, "tophat_spm_id_to_piece");
  bind(plugin.piece_to_id, "tophat_spm_piece_to_id");
  bind(plugin.train_bpe, "tophat_spm_train_bpe");
  bind(plugin.free_buffer, "tophat_spm_free_buffer");
  if (!missing.empty()) {
    dlclose(handle);
    return absl::FailedPreconditionError(absl::StrCat(opened.string(), " lacks symbols: ",
                                                      absl::StrJoin(missing, ", ")));
  }
  // The handle stays open for the life of the process.
  return plugin;
}

const absl::StatusOr<Plugin>& GetPlugin() {
  static const absl::StatusOr<Plugin>* const plugin = new absl::StatusOr<Plugin>(OpenPlugin());
  return *plugin;
}

// Takes ownership of a plugin error message.
std::string TakeError(const Plugin& plugin, char* error) {
  if (error == nullptr) return "unknown error";
  std::string message(error);
  plugin.free_buffer(error);
  return message;
}

}  // namespace

absl::Status SpmPluginStatus() { return GetPlugin().status(); }

absl::StatusOr<std::unique_ptr<SpmModel>> SpmModel::Load(const fs::path& model_path) {
  const auto& plugin = GetPlugin();
  if (!plugin.ok()) {
    return absl::Status(plugin.status().code(),
                        absl::StrCat(model_path.string(), ": ", plugin.status().message()));
  }
  std::error_code ec;
  if (!fs::is_regular_file(model_path, ec)) {
    return absl::NotFoundError(absl::StrCat(model_path.string(), ": no such file"));
  }
  char* error = nullptr;
  TophatSpm* handle = plugin->load(model_path.c_str(), &error);
  if (handle == nullptr) {
    return absl::InvalidArgumentError(absl::StrCat(
        model_path.string(), ": not a SentencePiece model: ", TakeError(*plugin, error)));
  }
  return std::unique_ptr<SpmModel>(new SpmModel(handle));
}

// A model exists only once the plugin has loaded, so GetPlugin() is ok from here on.
SpmModel::~SpmModel() { GetPlugin()->free_model(handle_); }

absl::StatusOr<std::vector<int>> SpmModel::Encode(std::string_view text) const {
  const Plugin& plugin = *GetPlugin();
  int* ids = nullptr;
  size_t num_ids = 0;
  char* error = nullptr;
  if (plugin.encode(handle_, text.data(), text.size(), &ids, &num_ids, &error) != 0) {
    return absl::InternalError(absl::StrCat("SentencePiece Encode: ", TakeError(plugin, error)));
  }
  std::vector<int> out(ids, ids + num_ids);
  plugin.free_buffer(ids);
  return out;
}

absl::StatusOr<std::string> SpmModel::Decode(const std::vector<int>& ids) const {
  const Plugin& plugin = *GetPlugin();
  const int size = piece_size();
  for (const int id : ids) {
    if (id < 0 || id >= size) {
      return absl::OutOfRangeError(
          absl::StrCat("token id ", id, " is outside the vocabulary [0, ", size, ")"));
    }
  }
  char* text = nullptr;
  size_t text_len = 0;
  char* error = nullptr;
  if (plugin.decode(handle_, ids.data(), ids.size(), &text, &text_len, &error) != 0) {
    return absl::InternalError(absl::StrCat("SentencePiece Decode: ", TakeError(plugin, error)));
  }
  std::string out(text, text_len);
  plugin.free_buffer(text);
  return out;
}

int SpmModel::piece_size() const { return GetPlugin()->piece_size(handle_); }
int SpmModel::bos_id() const { return GetPlugin()->bos_id(handle_); }
int SpmModel::eos_id() const { return GetPlugin()->eos_id(handle_); }

bool SpmModel::IsControl(int id) const {
  if (id < 0 || id >= piece_size()) return false;
  return GetPlugin()->is_control(handle_, id) != 0;
}

std::string_view SpmModel::IdToPiece(int id) const {
  if (id < 0 || id >= piece_size()) return {};
  size_t len = 0;
  const char* piece = GetPlugin()->id_to_piece(handle_, id, &len);
  return std::string_view(piece, len);
}

std::optional<int> SpmModel::PieceToId(std::string_view piece) const {
  const int id = GetPlugin()->piece_to_id(handle_, piece.data(), piece.size());
  if (id < 0) return std::nullopt;
  return id;
}

absl::StatusOr<std::string> SpmTrainBpe(const std::vector<std::string>& sentences,
                                        int vocab_size) {
  const auto& plugin = GetPlugin();
  if (!plugin.ok()) return plugin.status();
  std::vector<const char*> data;
  std::vector<size_t> lengths;
  data.reserve(sentences.size());
  lengths.reserve(sentences.size());
  for (const std::string& sentence : sentences) {
    data.push_back(sentence.data());
    lengths.push_back(sentence.size());
  }
  char* proto = nullptr;
  size_t proto_len = 0;
  char* error = nullptr;
  if (plugin->train_bpe(data.data(), lengths.data(), data.size(), vocab_size, &proto, &proto_len,
                        &error) != 0) {
    return absl::InvalidArgumentError(
        absl::StrCat("SentencePiece training failed: ", TakeError(*plugin, error)));
  }
  std::string out(proto, proto_len);
  plugin->free_buffer(proto);
  return out;
}

}  // namespace tophat
