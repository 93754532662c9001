// SPDX-License-Identifier: Apache-2.0
// Internal error type. Every internal function that can fail returns a Status; the C API turns it into a
// maxsim_status plus the thread-local last-error message. Nothing inside the library prints or aborts.
#ifndef MAXSIM_SRC_STATUS_H_
#define MAXSIM_SRC_STATUS_H_

#include <cstdarg>
#include <cstdint>
#include <cstring>
#include <string>
#include <utility>

#include "maxsim/maxsim.h"

namespace maxsim {

class [[nodiscard]] Status {
 public:
  Status() = default;
  Status(maxsim_status code, std::string message) : code_(code), message_(std::move(message)) {}
  static Status Ok() { return Status(); }

  bool ok() const { return code_ == MAXSIM_OK; }
  maxsim_status code() const { return code_; }
  const std::string& message() const { return message_; }

 private:
  maxsim_status code_ = MAXSIM_OK;
  std::string message_;
};

// printf-style message builder: Error(MAXSIM_ERR_INVALID_ARGUMENT, "dim %u is zero", dim).
Status Error(maxsim_status code, const char* format, ...) __attribute__((format(printf, 2, 3)));
std::string Format(const char* format, ...) __attribute__((format(printf, 1, 2)));

// Stores `status` as this thread's last error (if not ok) and returns its code.
maxsim_status Report(const Status& status);
void SetLastError(const std::string& message);

#define MAXSIM_RETURN_IF_ERROR(expr)     \
  do {                                   \
    ::maxsim::Status status_ = (expr);   \
    if (!status_.ok()) return status_;   \
  } while (0)

// Reads an enum that came from a caller as the integer it holds. C callers may store any value in an enum field,
// and loading an out-of-range value through the enum type is undefined behaviour in C++ (UBSan flags it), so
// every enum from outside is read this way and range-checked before it is used as an enum.
template <typename E>
inline int32_t RawEnum(const E& e) {
  static_assert(sizeof(E) == sizeof(int32_t), "public enums are 32-bit");
  int32_t v;
  std::memcpy(&v, &e, sizeof(v));
  return v;
}

// Overflow-checked arithmetic for sizes from outside.
inline bool MulOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_mul_overflow(a, b, out); }
inline bool AddOverflows(uint64_t a, uint64_t b, uint64_t* out) { return __builtin_add_overflow(a, b, out); }
inline uint64_t RoundUp(uint64_t x, uint64_t to) { return (x + to - 1) / to * to; }

}  // namespace maxsim

#endif  // MAXSIM_SRC_STATUS_H_
