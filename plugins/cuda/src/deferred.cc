// SPDX-License-Identifier: Apache-2.0
// Stream-ordered calls on the host (deferred.h): slots, the retirement of finished calls, the first deferred
// error, and the ordering of a later call after the last stream-ordered one.
#include "deferred.h"

#include <cstring>
#include <utility>

#include "backend.h"
#include "host_util.h"

namespace mscuda {
namespace {

constexpr uint64_t kWordsStride = 64;
static_assert(sizeof(DeferredWords) <= kWordsStride, "a slot's host words fit their stride");

// A slot's device words with no check fired.
DeferredDevice ClearDevice() {
  DeferredDevice d{};
  d.flags[0] = d.flags[1] = ~0ull;
  return d;
}

volatile DeferredWords* HostWords(Backend& b, uint32_t slot) {
  return reinterpret_cast<volatile DeferredWords*>(b.deferred.words.data() + slot * kWordsStride);
}

// What the synchronous call would have said, naming the stream-ordered call.
Status Describe(const DeferredState::Pending& p, const volatile DeferredWords* w) {
  const ull flags[2] = {w->flags[0], w->flags[1]};
  Status s;
  if (p.backward) {
    s = BackwardValueError(flags);
  } else {
    const int side = flags[0] != ~0ull ? 0 : 1;
    s = ForwardValueError(side, w->set[side], w->token[side]);
  }
  s.message = p.call + " (stream-ordered): " + s.message;
  return s;
}

Status Init(Backend& b) {
  DeferredState& st = b.deferred;
  if (st.done.size() == kDeferredSlots) return Status::Ok();
  MSC_RETURN(st.words.Reserve(kDeferredSlots * kWordsStride, "stream-ordered call flags"));
  MSC_RETURN(st.device.Reserve(kDeferredSlots * sizeof(DeferredDevice), "stream-ordered call flags"));
  DeferredDevice clear[kDeferredSlots];
  for (DeferredDevice& d : clear) d = ClearDevice();
  MSC_CUDA(cudaMemcpy(st.device.data(), clear, sizeof(clear), cudaMemcpyHostToDevice));
  // Every slot's event before any slot is handed out: a failure part-way leaves no free slot without its event
  // (the next call creates the rest).
  while (st.done.size() < kDeferredSlots) {
    cudaEvent_t e = nullptr;
    MSC_CUDA(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
    st.done.push_back(e);
  }
  for (uint32_t i = 0; i < kDeferredSlots; ++i) st.free_slots.push_back(kDeferredSlots - 1 - i);
  return Status::Ok();
}

}  // namespace

Status PollDeferred(Backend& b, bool wait) {
  DeferredState& st = b.deferred;
  size_t keep = 0;
  bool blocked = false;  // an earlier call has not finished: later ones (same stream, mostly) are not asked
  Status failed;         // a wait that failed (a broken device): the calls from it on stay pending
  size_t i = 0;
  for (; i < st.pending.size(); ++i) {
    DeferredState::Pending& p = st.pending[i];
    const volatile DeferredWords* w = HostWords(b, p.slot);
    bool done = false;
    if (wait || w->failed != 0u) {
      const cudaError_t e = cudaEventSynchronize(st.done[p.slot]);
      if (e != cudaSuccess) {
        failed = CudaFail(e, "cudaEventSynchronize (a stream-ordered call)");
        break;
      }
      done = true;
    } else if (!blocked) {
      const cudaError_t q = cudaEventQuery(st.done[p.slot]);
      if (q == cudaSuccess) {
        done = true;
      } else if (q == cudaErrorNotReady) {
        blocked = true;
      } else {
        failed = CudaFail(q, "cudaEventQuery (a stream-ordered call)");
        break;
      }
    }
    if (!done) {
      if (keep != i) st.pending[keep] = std::move(p);
      ++keep;
      continue;
    }
    if (w->failed != 0u && st.error.ok()) st.error = Describe(p, w);
    st.free_slots.push_back(p.slot);
  }
  // The list holds each pending call once, in order, whether or not a wait failed part-way: a retired call's slot
  // is free and never also pending (else a later call could be handed a slot that a stale entry still names).
  for (; i < st.pending.size(); ++i, ++keep) {
    if (keep != i) st.pending[keep] = std::move(st.pending[i]);
  }
  st.pending.resize(keep);
  return failed;
}

Status BeginOperation(Backend& b, cudaStream_t stream) {
  DeferredState& st = b.deferred;
  if (!st.pending.empty()) MSC_RETURN(PollDeferred(b, false));
  if (!st.error.ok()) return std::exchange(st.error, Status::Ok());
  if (st.last_ordered && stream != st.last_stream) {
    MSC_CUDA(cudaSetDevice(b.device));
    MSC_CUDA(cudaStreamWaitEvent(stream, st.last_event, 0));
  }
  return Status::Ok();
}

Status SynchronizeDeferred(Backend& b) {
  DeferredState& st = b.deferred;
  if (!st.pending.empty()) {
    MSC_CUDA(cudaSetDevice(b.device));
    MSC_RETURN(PollDeferred(b, true));
  }
  st.last_ordered = false;
  return std::exchange(st.error, Status::Ok());
}

Status AcquireSlot(Backend& b, cudaStream_t stream, DeferredSlot* out) {
  MSC_RETURN(Init(b));
  DeferredState& st = b.deferred;
  if (st.free_slots.empty()) {
    // Every slot dropped by AbandonSlot (its device could not be waited for): nothing in flight to wait for.
    if (st.pending.empty()) {
      return Fail(MAXSIM_ERR_PLUGIN, "no stream-ordered call slot is left: earlier calls failed waits on the device");
    }
    // kDeferredSlots calls in flight: wait for the oldest.
    MSC_CUDA(cudaEventSynchronize(st.done[st.pending.front().slot]));
    MSC_RETURN(PollDeferred(b, false));
  }
  out->index = st.free_slots.back();
  st.free_slots.pop_back();
  std::memset(const_cast<DeferredWords*>(HostWords(b, out->index)), 0, sizeof(DeferredWords));
  out->dev = reinterpret_cast<DeferredDevice*>(st.device.data()) + out->index;
  out->words = reinterpret_cast<DeferredWords*>(st.words.device_data() + out->index * kWordsStride);
  out->stream = stream;
  out->held = true;
  return Status::Ok();
}

Status CommitSlot(Backend& b, DeferredSlot& slot, const SettleArgs& settle, cudaStream_t stream, bool backward,
                  const char* call) {
  DeferredState& st = b.deferred;
  cudaError_t e = LaunchSettle(settle, stream);
  if (e == cudaSuccess) e = cudaEventRecord(st.done[slot.index], stream);
  if (e != cudaSuccess) return CudaFail(e, "enqueueing the settle kernel of a stream-ordered call");
  st.pending.push_back({slot.index, backward, call ? call : "a call"});
  slot.held = false;
  st.last_ordered = true;
  st.last_stream = stream;
  st.last_event = st.done[slot.index];
  return Status::Ok();
}

void AbandonSlot(Backend& b, DeferredSlot& slot) {
  if (!slot.held) return;
  slot.held = false;
  // The call failed before its settle kernel: once its stream has finished, the device words are cleared here (a
  // kernel of the call may have set them) and the slot is free again.
  const DeferredDevice clear = ClearDevice();
  if (cudaStreamSynchronize(slot.stream) == cudaSuccess &&
      cudaMemcpy(slot.dev, &clear, sizeof(clear), cudaMemcpyHostToDevice) == cudaSuccess) {
    b.deferred.free_slots.push_back(slot.index);
  } else {
    cudaGetLastError();  // the slot is dropped: a device that cannot copy 32 bytes fails every later call anyway
  }
}

void ReleaseDeferred(Backend& b) {
  DeferredState& st = b.deferred;
  for (const DeferredState::Pending& p : st.pending) cudaEventSynchronize(st.done[p.slot]);
  st.pending.clear();
  for (cudaEvent_t e : st.done) cudaEventDestroy(e);
  st.done.clear();
  st.free_slots.clear();
  st.words.Release();
  st.device.Release();
}

}  // namespace mscuda
