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

#if defined(__wasi__)
#define MAXSIM_NO_MMAP 1  // WASI: packed files are read into owned memory, buffers come from aligned_alloc
#endif

namespace maxsim {

using ull = unsigned long long;

Status SavePackedFile(const pack::PackedView& view, const char* path) {
  if (path == nullptr || path[0] == '\0') return Error(MAXSIM_ERR_INVALID_ARGUMENT, "file path is empty");
  const std::string tmp = std::string(path) + ".tmp." + std::to_string(getpid());
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) {
    return Error(MAXSIM_ERR_IO, "cannot create %s: %s (does the folder exist and is it writable?)", tmp.c_str(),
                 std::strerror(errno));
  }
  uint64_t done = 0;
  while (done < view.size) {
    const size_t chunk = static_cast<size_t>(std::min<uint64_t>(view.size - done, 1u << 30));
    const ssize_t n = write(fd, view.base + done, chunk);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) {
      const int err = errno;
      close(fd);
      unlink(tmp.c_str());
      return Error(MAXSIM_ERR_IO, "writing %s failed after %llu of %llu bytes: %s", tmp.c_str(),
                   static_cast<ull>(done), static_cast<ull>(view.size), std::strerror(err));
    }
    done += static_cast<uint64_t>(n);
  }
  if (fsync(fd) != 0 || close(fd) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Error(MAXSIM_ERR_IO, "flushing %s failed: %s", tmp.c_str(), std::strerror(err));
  }
  if (rename(tmp.c_str(), path) != 0) {
    const int err = errno;
    unlink(tmp.c_str());
    return Error(MAXSIM_ERR_IO, "renaming %s to %s failed: %s", tmp.c_str(), path, std::strerror(err));
  }
  return Status::Ok();
}

Status LoadPackedFile(const char* path, maxsim_validation level, maxsim_packed** out) {
  if (path == nullptr || path[0] == '\0') return Error(MAXSIM_ERR_INVALID_ARGUMENT, "file path is empty");
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return Error(MAXSIM_ERR_IO, "cannot open %s: %s", path, std::strerror(errno));
  struct stat st;
  if (fstat(fd, &st) != 0) {
    const int err = errno;
    close(fd);
    return Error(MAXSIM_ERR_IO, "cannot stat %s: %s", path, std::strerror(err));
  }
  if (!S_ISREG(st.st_mode)) {
    close(fd);
    return Error(MAXSIM_ERR_IO, "%s is not a regular file", path);
  }
  const uint64_t size = static_cast<uint64_t>(st.st_size);
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
  Status s = pack::Validate(map, size, level, &view);
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
