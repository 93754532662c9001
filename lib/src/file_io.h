// SPDX-License-Identifier: Apache-2.0
// Packed files: save (write to a temporary name, then rename) and load (read-only mmap, then validate).
#ifndef MAXSIM_SRC_FILE_IO_H_
#define MAXSIM_SRC_FILE_IO_H_

#include "packed.h"
#include "status.h"

struct maxsim_packed;

namespace maxsim {

Status SavePackedFile(const pack::PackedView& view, const char* path);
Status LoadPackedFile(const char* path, maxsim_validation level, const pack::RowOps& ops, maxsim_packed** out);
// Frees or unmaps what a handle owns (not the handle itself).
void ReleasePackedStorage(maxsim_packed* packed);

}  // namespace maxsim

#endif  // MAXSIM_SRC_FILE_IO_H_
