// SPDX-License-Identifier: Apache-2.0
// `maxsim pack`: .npy token vectors + offsets [+ ids] -> a validated packed file.
#include <algorithm>
#include <cstdio>

#include "cli.h"

namespace maxsim::cli {

int RunPack(int argc, char** argv) {
  std::vector<OptionSpec> options = {
      {"output", 'o', "OUT.maxsim", "Packed file to write (required). Written atomically: no partial file on error."},
      {"ids", 0, "IDS", "Ids, one per set: a text file with one UTF-8 id per line (stored as string ids), or an\n"
                        "                            int64/uint64 .npy (stored as numeric ids)."},
      {"dtype", 0, "keep|f16|bf16", "Dtype of the stored full-precision originals (default keep: as read)."},
  };
  for (const OptionSpec& o : ContextOptions()) {
    if (std::string(o.name) != "backend" && std::string(o.name) != "isa") options.push_back(o);
  }
  CommandSpec spec{
      "pack", "TOKENS.npy OFFSETS.npy -o OUT.maxsim [options]",
      "Pack a collection of token sets (a corpus shard, or a batch of queries) into one packed file.",
      "TOKENS.npy   float32, float16 or bfloat16 [n_tokens, dim], C order: every set's tokens, row after row.\n"
      "OFFSETS.npy  int64 or uint64 [n_sets + 1]: set i owns rows offsets[i] .. offsets[i+1] (like cu_seqlens);\n"
      "             starts at 0, never decreases, ends at n_tokens. Equal neighbours make an empty set.\n"
      "The file holds i8 codes + quantisation metadata (for certified/approximate search) and the originals\n"
      "(for exact search and refinement); see packing/README.md.",
      options, 2, 2};
  Args args;
  if (!args.Parse(spec, argc, argv)) return kExitOk;
  const std::string out = args.Str("output", "");
  if (out.empty()) throw UsageError("'maxsim pack' needs the output file: -o OUT.maxsim");
  const std::string dtype = args.Choice("dtype", "keep", {"keep", "f16", "bf16"});
  const std::string& tokens_path = args.positional()[0];
  const std::string& offsets_path = args.positional()[1];
  maxsim_context* ctx = MakeContext(args);

  const double t0 = Now();
  Tokens tokens;
  std::vector<uint64_t> offsets, ids;
  std::vector<std::string> string_ids;
  {
    Progress p("reading " + tokens_path, 0);
    tokens = ReadTokens(tokens_path);
    offsets = ReadOffsets(offsets_path, tokens.rows, tokens_path);
    const std::string ids_path = args.Str("ids", "");
    if (!ids_path.empty() && IsNpyFile(ids_path)) {
      ids = ReadNumericIds(ids_path, offsets.size() - 1);
    } else if (!ids_path.empty()) {
      string_ids = ReadStringIds(ids_path, offsets.size() - 1, "sets");
    }
    if (dtype != "keep") {
      p.Stage("converting to " + dtype);
      ConvertTokens(&tokens, dtype == "f16" ? MAXSIM_F16 : MAXSIM_BF16, tokens_path);
    }
  }
  const double t1 = Now();
  maxsim_dense_sets sets{};
  sets.struct_size = sizeof(sets);
  sets.memory = MAXSIM_MEMORY_HOST;
  sets.data = tokens.data.data();
  sets.dtype = tokens.dtype;
  sets.dim = tokens.dim;
  sets.n_sets = offsets.size() - 1;
  sets.offsets = offsets.data();
  maxsim_packed* packed = nullptr;
  maxsim_status st;
  {
    // The library reports the rows packed so far through its progress callback (on this thread); the line shows
    // the percentage, the rate and the ETA.
    Progress p("packing", tokens.rows, "vectors");
    maxsim_set_progress(
        [](void* user, uint64_t done, uint64_t) {
          static_cast<Progress*>(user)->Set(done);
          return 0;
        },
        &p);
    const uint64_t* numeric = ids.empty() ? nullptr : ids.data();
    if (args.Has("ids") && !string_ids.empty()) {
      std::vector<const char*> text(string_ids.size());
      for (size_t i = 0; i < text.size(); ++i) text[i] = string_ids[i].c_str();
      st = maxsim_pack_with_string_ids(ctx, &sets, numeric, text.data(), &packed);
    } else {
      st = maxsim_pack(ctx, &sets, numeric, &packed);
    }
    maxsim_set_progress(nullptr, nullptr);
    if (st == MAXSIM_OK) p.Set(tokens.rows);
  }
  const double t2 = Now();
  maxsim_context_destroy(ctx);
  Check(st, "packing " + tokens_path);
  {
    Progress p("writing " + out, 0);
    st = maxsim_packed_save(packed, out.c_str());
  }
  maxsim_packed_desc desc{};
  maxsim_packed_describe(packed, &desc);
  maxsim_packed_release(packed);
  Check(st, "writing " + out);
  const double t3 = Now();
  if (args.Has("quiet")) return kExitOk;
  std::printf("packed %llu sets, %llu vectors, dim %u, %s originals%s -> %s (%s)\n",
              static_cast<unsigned long long>(desc.n_sets), static_cast<unsigned long long>(desc.n_vectors), desc.dim,
              DtypeName(desc.dtype),
              !string_ids.empty() ? ", with string ids" : desc.has_ids ? ", with numeric ids" : "", out.c_str(),
              HumanBytes(static_cast<double>(desc.size)).c_str());
  std::printf("read %s, pack %s (%s vectors/s), write %s\n", HumanSeconds(t1 - t0).c_str(),
              HumanSeconds(t2 - t1).c_str(), HumanCount(desc.n_vectors / std::max(t2 - t1, 1e-9)).c_str(),
              HumanSeconds(t3 - t2).c_str());
  return kExitOk;
}

}  // namespace maxsim::cli
