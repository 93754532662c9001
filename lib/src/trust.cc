// SPDX-License-Identifier: Apache-2.0
// The trust model of certified mode. Its guarantee (the same bits as exact mode) rests on a buffer's codes,
// residual norms and code sums matching its originals, which STANDARD validation cannot prove. A handle packed by
// this library or DEEP-validated is proven; one opened FAST is trusted on the caller's word; one opened or loaded
// at STANDARD is DEEP-validated once, before its first certified use, so that nobody gets a silently non-exact
// "certified" answer from a buffer they did not pack.
#include "packed_handle.h"

namespace maxsim {

maxsim_packed::Trust TrustAfter(maxsim_validation level) {
  switch (level) {
    case MAXSIM_VALIDATE_DEEP: return maxsim_packed::Trust::kProven;
    case MAXSIM_VALIDATE_FAST: return maxsim_packed::Trust::kTrusted;
    default: return maxsim_packed::Trust::kUnproven;
  }
}

Status ProveForCertified(const maxsim_packed& packed, int threads, const pack::RowOps& ops, const char* role) {
  if (packed.trust != maxsim_packed::Trust::kUnproven) return Status::Ok();
  LockGuard lock(packed.proof_mu);
  if (packed.proof_state == 0) {
    const Status st = pack::CheckDeep(packed.view, threads, ops);
    packed.proof_state = st.ok() ? 1 : 2;
    packed.proof_error = st.message();
  }
  if (packed.proof_state == 1) return Status::Ok();
  return Error(MAXSIM_ERR_INVALID_BUFFER,
               "%s: certified mode needs codes and metadata that match the originals; DEEP validation, run before "
               "the first certified use of a buffer opened or loaded at STANDARD, found they do not (%s). Repack the "
               "data, or score it in exact mode",
               role, packed.proof_error.c_str());
}

}  // namespace maxsim
