// Minimal .npy v1.0 writer: magic, version 1.0, a little-endian header length, a Python-dict header
// padded with spaces to a 64-byte boundary and ending in '\n', then the raw C-order data. Written
// through OutputFile: a full disk is an error naming the file, never a truncated .npy.
#include "tools/mxmoe/cli.h"

namespace mxmoe::cli {

void write_npy(const std::string& path, const void* data, const char* descr, size_t elem_bytes,
               const std::vector<int64_t>& shape) {
  std::string dims;  // "a, b" or "a," (Python's one-element tuple)
  size_t count = 1;
  for (size_t i = 0; i < shape.size(); ++i) {
    dims += (i ? ", " : "") + std::to_string(shape[i]);
    count *= static_cast<size_t>(shape[i]);
  }
  if (shape.size() == 1) dims += ',';
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': (" + dims + "), }";
  const size_t unpadded = 10 + header.size() + 1;
  header.append((64 - unpadded % 64) % 64, ' ');
  header += '\n';
  OutputFile f("--dump", path);
  const char magic[8] = {'\x93', 'N', 'U', 'M', 'P', 'Y', 1, 0};
  f.write(magic, 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char len_bytes[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  f.write(len_bytes, 2);
  f.write(header);
  f.write(data, count * elem_bytes);
  f.commit();
}

void write_npy_bf16_as_f32(const std::string& path, const std::vector<uint16_t>& bits,
                           const std::vector<int64_t>& shape) {
  std::vector<float> f(bits.size());
#pragma omp parallel for
  for (int64_t i = 0; i < static_cast<int64_t>(bits.size()); ++i) f[i] = f32_from_bf16(bits[i]);
  write_npy(path, f.data(), "<f4", 4, shape);
}

}  // namespace mxmoe::cli
