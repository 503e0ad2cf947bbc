// The C ABI of the SentencePiece plugin (libtophat_spm_plugin.so).
//
// Why a plugin: Debian's libsentencepiece carries its own copy of protobuf-lite and exports
// those symbols. Linked into a process that also loads libprotobuf (LibTorch, gRPC), the two
// copies interpose on each other and the process crashes during static initialisation. The
// plugin is dlopen()ed with RTLD_LOCAL | RTLD_DEEPBIND (under a sanitizer runtime, into a link
// namespace of its own) so SentencePiece binds to its own copy and nothing else sees it. Only
// plain C types, and buffers the plugin allocates and frees itself, cross this boundary.
#pragma once

#include <stddef.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct TophatSpm TophatSpm;

// Every `char** error` out-parameter receives a malloc()ed message on failure; free it with
// tophat_spm_free_buffer. Functions returning int return 0 on success.
TophatSpm* tophat_spm_load(const char* path, char** error);
void tophat_spm_free(TophatSpm* spm);
int tophat_spm_encode(const TophatSpm* spm, const char* text, size_t text_len, int** ids,
                      size_t* num_ids, char** error);
int tophat_spm_decode(const TophatSpm* spm, const int* ids, size_t num_ids, char** text,
                      size_t* text_len, char** error);
int tophat_spm_piece_size(const TophatSpm* spm);
int tophat_spm_bos_id(const TophatSpm* spm);
int tophat_spm_eos_id(const TophatSpm* spm);
int tophat_spm_is_control(const TophatSpm* spm, int id);
// The piece's bytes stay valid while `spm` lives.
const char* tophat_spm_id_to_piece(const TophatSpm* spm, int id, size_t* len);
int tophat_spm_piece_to_id(const TophatSpm* spm, const char* piece, size_t len);
// Trains a BPE model; *model_proto receives the serialized ModelProto (malloc()ed).
int tophat_spm_train_bpe(const char* const* sentences, const size_t* lengths, size_t count,
                         int vocab_size, char** model_proto, size_t* model_len, char** error);
void tophat_spm_free_buffer(void* buffer);

#ifdef __cplusplus
}
#endif
