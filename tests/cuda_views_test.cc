// SPDX-License-Identifier: Apache-2.0
// The CUDA plugin's views of packed images, as host code (no GPU needed): which sets are uniform, and that a view
// addresses every set's rows the same way with offsets, by set length, and as a run of its sets (a chunk). The
// GPU suite scores through these views against the CPU reference; this pins the addressing itself, including the
// resident chunks' arithmetic, which only corpora too large for one output budget reach.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstdint>
#include <vector>

#include "host_util.h"

namespace {

using mscuda::PackedInfo;
using mscuda::SetsView;

// A packed view of sets with these offsets (rows of dim 64, f32 originals), over zeroed host arrays.
struct Packed {
  std::vector<uint64_t> offsets;
  std::vector<uint8_t> originals;
  std::vector<int8_t> codes;
  std::vector<maxsim_vector_meta> meta;
  maxsim_packed_view view{};
  explicit Packed(std::vector<uint64_t> o) : offsets(std::move(o)) {
    const uint64_t rows = offsets.back();
    originals.assign(rows * 256, 0);
    codes.assign(rows * 64, 0);
    meta.assign(rows, maxsim_vector_meta{});
    view.struct_size = sizeof(view);
    view.dim = 64;
    view.padded_dim = 64;
    view.orig_row_bytes = 256;
    view.orig_dtype = MAXSIM_PACK_F32;
    view.n_sets = offsets.size() - 1;
    view.n_rows = rows - offsets[0];
    for (size_t i = 0; i + 1 < offsets.size(); ++i) {
      view.max_set_rows = std::max<uint64_t>(view.max_set_rows, offsets[i + 1] - offsets[i]);
    }
    view.offsets = offsets.data();
    view.codes = codes.data();
    view.meta = meta.data();
    view.originals = originals.data();
  }
};

PackedInfo Describe(const Packed& p) {
  PackedInfo in;
  EXPECT_TRUE(mscuda::DescribeImage(p.view, "test", &in).ok());
  return in;
}

// The image of p in host memory and its view, as the kernels would see it on the device.
struct Image {
  std::vector<uint8_t> bytes;
  SetsView view;
  Image(const Packed& p, const PackedInfo& in) : bytes(in.total_size) {
    mscuda::WriteImage(p.view, in, bytes.data());
    view = mscuda::PackedView(in, bytes.data());
  }
};

TEST(CudaViews, UniformSetsAreFoundFromTheirOffsets) {
  const PackedInfo u = Describe(Packed({5, 8, 11, 14}));  // three sets of 3 rows after row 5 (a slice of a buffer)
  EXPECT_TRUE(u.uniform);
  EXPECT_EQ(u.set_length, 3u);
  const PackedInfo one = Describe(Packed({2, 6}));  // one set: a single query
  EXPECT_TRUE(one.uniform);
  EXPECT_EQ(one.set_length, 4u);
  const PackedInfo empty = Describe(Packed({0, 0, 0}));  // sets of no tokens
  EXPECT_TRUE(empty.uniform);
  EXPECT_EQ(empty.set_length, 0u);
  EXPECT_FALSE(Describe(Packed({0, 3, 3, 7})).uniform);  // ragged, with an empty set
  EXPECT_FALSE(Describe(Packed({0, 3, 6, 10})).uniform);  // only the last differs
  EXPECT_FALSE(Describe(Packed({0})).uniform);  // no sets
}

// Every set of v (and of each run of its sets) has the rows `offsets` gives it, rebased to the first.
void ExpectRows(const SetsView& v, const std::vector<uint64_t>& offsets) {
  const uint64_t n = offsets.size() - 1, r0 = offsets[0];
  ASSERT_EQ(v.n_sets, n);
  for (uint64_t i = 0; i < n; ++i) {
    EXPECT_EQ(v.Begin(i), offsets[i] - r0) << "set " << i;
    EXPECT_EQ(v.End(i), offsets[i + 1] - r0) << "set " << i;
  }
  for (uint64_t j0 = 0; j0 <= n; ++j0) {
    for (uint64_t j1 = j0; j1 <= n; ++j1) {
      const SetsView s = v.Sets(j0, j1);
      ASSERT_EQ(s.n_sets, j1 - j0);
      for (uint64_t i = 0; i < j1 - j0; ++i) {
        EXPECT_EQ(s.Begin(i), offsets[j0 + i] - r0) << "sets [" << j0 << ", " << j1 << "), set " << i;
        EXPECT_EQ(s.End(i), offsets[j0 + i + 1] - r0) << "sets [" << j0 << ", " << j1 << "), set " << i;
      }
    }
  }
}

TEST(CudaViews, UniformViewsAddressRowsByLengthAndRaggedOnesByOffsets) {
  const Packed uniform({5, 8, 11, 14, 17});
  const Image u(uniform, Describe(uniform));
  EXPECT_EQ(u.view.offsets, nullptr);  // no load before a kernel's first copy
  EXPECT_EQ(u.view.set_length, 3u);
  EXPECT_EQ(u.view.MeanRows(), 3u);
  ExpectRows(u.view, uniform.offsets);

  const Packed ragged({5, 8, 8, 15, 16});
  const Image r(ragged, Describe(ragged));
  EXPECT_NE(r.view.offsets, nullptr);  // the image's rebased offsets
  ExpectRows(r.view, ragged.offsets);
}

TEST(CudaViews, ARunOfSetsOfAChunkBufferStartsAtItsFirstRow) {
  // A streamed corpus's chunk holds the rows of sets [j0, j1) from its start (operations.cc): RowsFromChunkStart
  // takes the rows before set j0 off again, for uniform and ragged sets alike, over views that start past row 0.
  const std::vector<uint64_t> uniform = {3, 7, 11, 15, 19}, ragged = {3, 7, 7, 12, 19};
  for (const std::vector<uint64_t>& offsets : {uniform, ragged}) {
    const Packed p(offsets);
    const PackedInfo in = Describe(p);
    EXPECT_EQ(in.uniform, offsets == uniform);
    std::vector<uint64_t> rebased;  // the corpus's host offsets (Corpus::offsets)
    for (uint64_t o : offsets) rebased.push_back(o - offsets[0]);
    const Image img(p, in);
    const uint64_t* dev_offsets = reinterpret_cast<const uint64_t*>(img.bytes.data() + in.off_offsets);
    for (uint64_t j0 = 0; j0 < 4; ++j0) {
      for (uint64_t j1 = j0; j1 <= 4; ++j1) {
        const SetsView s = mscuda::RowsFromChunkStart(in, rebased.data(), dev_offsets, j0, j1);
        ASSERT_EQ(s.n_sets, j1 - j0);
        EXPECT_EQ(s.n_rows, rebased[j1] - rebased[j0]);
        EXPECT_EQ(s.offsets == nullptr, in.uniform);
        for (uint64_t i = 0; i < j1 - j0; ++i) {
          EXPECT_EQ(s.Begin(i), rebased[j0 + i] - rebased[j0]) << "sets [" << j0 << ", " << j1 << "), set " << i;
          EXPECT_EQ(s.End(i), rebased[j0 + i + 1] - rebased[j0]) << "sets [" << j0 << ", " << j1 << "), set " << i;
        }
      }
    }
  }
}

}  // namespace
