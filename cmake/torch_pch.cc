// The translation unit the precompiled LibTorch headers are made from (cmake/torch_pch.cmake).
int main() { return 0; }
