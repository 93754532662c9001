// SPDX-License-Identifier: Apache-2.0
// Files from outside, read and replaced safely (header-only: the library, the CLI and the .npy reader share it).
// Every file read must be a regular file, checked before anything can block on it: open() of a FIFO blocks
// until a writer appears, and a device may never end. Every file written goes to a fresh temporary name beside
// the target, is flushed and renamed into place, and never replaces a target that exists and is not a regular
// file (a device node, FIFO, socket or directory).
#ifndef MAXSIM_PACKING_REGULAR_FILE_H_
#define MAXSIM_PACKING_REGULAR_FILE_H_

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>
#include <vector>

namespace maxsim::file {

// What a non-regular file is, for messages ("a directory").
inline const char* KindName(mode_t mode) {
  if (S_ISDIR(mode)) return "a directory";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISSOCK(mode)) return "a socket";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  return "not a regular file";
}

// Opens `path` read-only (O_NONBLOCK, so that a FIFO cannot block the open), refuses anything but a regular file,
// then clears O_NONBLOCK. Returns the descriptor and sets *size, or returns -1 and sets *error (naming the path).
inline int OpenRegular(const std::string& path, uint64_t* size, std::string* error) {
  const int fd = open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC | O_NOCTTY);
  if (fd < 0) {
    *error = path + ": cannot open: " + std::strerror(errno);
    return -1;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    *error = path + ": cannot stat: " + std::strerror(errno);
    close(fd);
    return -1;
  }
  if (!S_ISREG(st.st_mode)) {
    *error = path + " is " + KindName(st.st_mode) + ", not a regular file";
    close(fd);
    return -1;
  }
  const int flags = fcntl(fd, F_GETFL);
  if (flags >= 0) fcntl(fd, F_SETFL, flags & ~O_NONBLOCK);
  *size = static_cast<uint64_t>(st.st_size);
  return fd;
}

// Reads a whole regular file. "" on success, else a message naming the path.
inline std::string ReadRegular(const std::string& path, std::vector<uint8_t>* out) {
  uint64_t size = 0;
  std::string error;
  const int fd = OpenRegular(path, &size, &error);
  if (fd < 0) return error;
  out->clear();
  out->reserve(static_cast<size_t>(size));
  uint8_t buf[1 << 16];
  for (;;) {
    const ssize_t n = read(fd, buf, sizeof(buf));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      error = path + ": read error: " + std::strerror(errno);
      break;
    }
    if (n == 0) break;
    out->insert(out->end(), buf, buf + n);
  }
  close(fd);
  return error;
}

// "" if `path` does not exist or is a regular file (through symbolic links), else why it must not be replaced.
inline std::string CheckReplaceable(const std::string& path) {
  struct stat st;
  if (stat(path.c_str(), &st) != 0) return "";
  if (S_ISREG(st.st_mode)) return "";
  return path + " exists and is " + KindName(st.st_mode) + ", not a regular file: refusing to replace it";
}

// Writes the concatenated parts to `path` through a new temporary file beside it (O_EXCL: never an existing
// file), fsync and rename: no partial target on failure, the temporary removed. "" on success, else a message.
inline std::string WriteAtomically(const std::string& path, const std::vector<std::pair<const void*, uint64_t>>& parts) {
  if (path.empty()) return "file path is empty";
  std::string error = CheckReplaceable(path);
  if (!error.empty()) return error;
  static std::atomic<unsigned> serial{0};
  const std::string tmp = path + ".tmp." + std::to_string(getpid()) + "." + std::to_string(serial.fetch_add(1));
  const int fd = open(tmp.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd < 0) return "cannot create " + tmp + ": " + std::strerror(errno) + " (does the folder exist and is it writable?)";
  uint64_t done = 0;
  for (const auto& part : parts) {
    const auto* p = static_cast<const uint8_t*>(part.first);
    uint64_t at = 0;
    while (at < part.second && error.empty()) {
      const size_t chunk = static_cast<size_t>(std::min<uint64_t>(part.second - at, 1u << 30));
      const ssize_t n = write(fd, p + at, chunk);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) {
        error = "writing " + tmp + " failed after " + std::to_string(done) + " bytes: " +
                std::strerror(n < 0 ? errno : ENOSPC);
      } else {
        at += static_cast<uint64_t>(n);
        done += static_cast<uint64_t>(n);
      }
    }
  }
  if (error.empty() && fsync(fd) != 0) error = "flushing " + tmp + " failed: " + std::strerror(errno);
  if (close(fd) != 0 && error.empty()) error = "closing " + tmp + " failed: " + std::strerror(errno);
  // Checked again just before the rename, which would replace whatever the target has become.
  if (error.empty()) error = CheckReplaceable(path);
  if (error.empty() && rename(tmp.c_str(), path.c_str()) != 0) {
    error = "renaming " + tmp + " to " + path + " failed: " + std::strerror(errno);
  }
  if (!error.empty()) unlink(tmp.c_str());
  return error;
}

}  // namespace maxsim::file

#endif  // MAXSIM_PACKING_REGULAR_FILE_H_
