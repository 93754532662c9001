// SPDX-License-Identifier: Apache-2.0
#include "file_io.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <string>

#include "packed_handle.h"
#include "regular_file.h"

#if defined(__wasi__)
#define MAXSIM_NO_MMAP 1  // WASI: packed files are read into owned memory, buffers come from aligned_alloc
#endif

namespace maxsim {

using ull = unsigned long long;

Status SavePackedFile(const pack::PackedView& view, const char* path) {
  if (path == nullptr || path[0] == '\0') return Error(MAXSIM_ERR_INVALID_ARGUMENT, "file path is empty");
  const std::string error = file::WriteAtomically(path, {{view.base, view.size}});
  if (!error.empty()) return Error(MAXSIM_ERR_IO, "%s", error.c_str());
  return Status::Ok();
}

Status LoadPackedFile(const char* path, maxsim_validation level, const pack::RowOps& ops, maxsim_packed** out) {
  if (path == nullptr || path[0] == '\0') return Error(MAXSIM_ERR_INVALID_ARGUMENT, "file path is empty");
  uint64_t size = 0;
  std::string error;
  const int fd = file::OpenRegular(path, &size, &error);  // refuses FIFOs, devices and folders before any read
  if (fd < 0) return Error(MAXSIM_ERR_IO, "%s", error.c_str());
  if (size < MAXSIM_PACK_HEADER_SIZE) {
    close(fd);
    return Error(MAXSIM_ERR_INVALID_BUFFER, "invalid packed file %s: %llu bytes is smaller than the %u-byte header",
                 path, static_cast<ull>(size), MAXSIM_PACK_HEADER_SIZE);
  }
#if defined(MAXSIM_NO_MMAP)
  // Read into owned, aligned memory (WASI has no file mappings; its emulated mmap is an unaligned copy).
  void* map = AllocatePacked(size);
  if (map == nullptr) {
    close(fd);
    return Error(MAXSIM_ERR_OUT_OF_MEMORY, "cannot allocate %llu bytes to read %s", static_cast<ull>(size), path);
  }
  for (uint64_t done = 0; done < size;) {
    const ssize_t n = read(fd, static_cast<char*>(map) + done, static_cast<size_t>(std::min<uint64_t>(size - done, 1u << 30)));
    if (n <= 0) {
      const int err = n < 0 ? errno : EIO;
      close(fd);
      FreePacked(map, size);
      return Error(MAXSIM_ERR_IO, "cannot read %s: %s", path, std::strerror(err));
    }
    done += static_cast<uint64_t>(n);
  }
  close(fd);
  const auto storage = maxsim_packed::Storage::kOwned;
  auto release = [&] { FreePacked(map, size); };
#else
  void* map = mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int map_err = errno;
  close(fd);
  if (map == MAP_FAILED) {
    return Error(MAXSIM_ERR_IO, "cannot map %s (%llu bytes): %s", path, static_cast<ull>(size), std::strerror(map_err));
  }
  const auto storage = maxsim_packed::Storage::kMapped;
  auto release = [&] { munmap(map, size); };
#endif
  pack::PackedView view;
  Status s = pack::Validate(map, size, level, &view, ops);
  if (!s.ok()) {
    release();
    return Status(s.code(), std::string(path) + ": " + s.message());
  }
  auto* p = new maxsim_packed;
  p->view = view;
  p->storage = storage;
  p->memory = map;
  p->mapped_bytes = size;
  p->uid = NextPackedUid();
  p->trust = TrustAfter(level);
  *out = p;
  return Status::Ok();
}

namespace {
constexpr uint64_t kMmapThreshold = 4ull << 20;
}  // namespace

void* AllocatePacked(uint64_t bytes) {
#if defined(MAXSIM_NO_MMAP)
  return std::aligned_alloc(MAXSIM_PACK_ALIGN, RoundUp(bytes, MAXSIM_PACK_ALIGN));
#endif
  if (bytes < kMmapThreshold) return std::aligned_alloc(MAXSIM_PACK_ALIGN, RoundUp(bytes, MAXSIM_PACK_ALIGN));
  void* p = mmap(nullptr, bytes, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void FreePacked(void* memory, uint64_t bytes) {
  if (memory == nullptr) return;
#if defined(MAXSIM_NO_MMAP)
  bytes = 0;  // every block came from aligned_alloc
#endif
  if (bytes < kMmapThreshold) {
    std::free(memory);
  } else {
    munmap(memory, bytes);
  }
}

void ReleasePackedStorage(maxsim_packed* packed) {
  switch (packed->storage) {
    case maxsim_packed::Storage::kOwned: FreePacked(packed->memory, packed->mapped_bytes); break;
    case maxsim_packed::Storage::kMapped: munmap(packed->memory, packed->mapped_bytes); break;
    case maxsim_packed::Storage::kBorrowed: break;
  }
  packed->memory = nullptr;
}

}  // namespace maxsim
