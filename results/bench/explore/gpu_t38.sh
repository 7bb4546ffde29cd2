#!/usr/bin/env bash
# Triton 3.8 (production) timings on the GPU machine, from cubins compiled here (benchmarks/prod_cubins.py).
#
#   bash results/bench/explore/gpu_t38.sh build        # here, no GPU, ~10 min: .gpu-cubins/{decode,indexer,topk,...}
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh run", carry=[".gpu-cubins"])   # device tool
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh paths", carry=[".gpu-cubins", ".gpu"])  # or
#   paths-decode (DECODE_LIMIT_S=560) and paths-indexer in two calls
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh v32", carry=[".gpu-cubins", ".gpu"])
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh opaque", carry=[".gpu-cubins"])
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh ws", carry=[".gpu-cubins"])   # after build-ws
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh lazy", carry=[".gpu-cubins"])   # after build-lazy
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh lift", carry=[".gpu-cubins/lift", ".gpu-cubins/lift_v32"])
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh pf", carry=[".gpu-cubins/pf", ".gpu-cubins/pf_v32"])
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh next", carry=[".gpu-cubins/decode", ".gpu"])  # ~9 min
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh h64", carry=[".gpu-cubins/h64", ".gpu"])  # after build-h64
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh hfast", carry=[".gpu-cubins/hfast", ".gpu"])  # build-hfast
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh hf32", carry=[".gpu-cubins/hf32_v32", ".gpu"])  # build-hf32
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluon", carry=[".gpu-cubins/gluon", ".gpu"])  # after
#   PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode.py build
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluon32", carry=[".gpu-cubins/gluon_v32", ".gpu"])
#   after PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_decode_v32.py build
#   after bash results/bench/explore/gpu_t38.sh build-gluonws (GLUONWS_SHAPES):
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh gluonws", carry=[".gpu-cubins/gluon_ws", ".gpu"])
#
# Cubins live in DIR/<code path>: `native`, and `sm89` = the mma.sync code Triton 3.8 emits under
# TRITON_OVERRIDE_ARCH=sm89 (the sm_80..sm_120 code and configurations) as sm_90 cubins, which the H200 runs.
# `paths` (one device call): the decode's target and prefill shapes and the indexer's logits / fused launches in both
# code paths, each from 3.8 cubins next to the GPU machine's 3.6 (issue #13's sm_89-path rules on production's compiler),
# FlashMLA beside them when .gpu (its sgl-flash-mla wheel, benchmarks/gpu-setup.sh) is carried. `v32`: the formal
# DeepSeek-V3.2 decode run (issue #17: within 1.3x of FlashMLA) with `sparsemla_t38_graph` in both code paths.
#
# `run` (one device call, ~8 min): first the replayed top-k's outputs against torch.topk (every row's `exact` must be
# true before any time means anything), then the top-k digit-width A/B from 3.8 cubins (wide digits pay on 3.8, whose
# tl.histogram is one shared atomic per key, see README.md), then the same A/B's default and wide variants with the
# GPU machine's Triton 3.6, then the V4 decode's target shapes from 3.8 cubins next to 3.6 (3.8 spills 88 B per thread
# at B = 64 on sm_90 ahead of time, 3.6 8 B). JSON under $OUT; the formal top-k run then takes
# `--cubins .gpu-cubins/topk` (benchmarks/topk.py: provider sparsemla_split_t38):
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh formal native", carry=[".gpu-cubins", ".gpu"])
#   run(command="SHA=<sha> bash results/bench/explore/gpu_t38.sh formal sm89", carry=[".gpu-cubins", ".gpu"])
#   then here: python -m benchmarks.topk --merge A.json --merge B.json && python -m benchmarks.report
set -uo pipefail
cd "$(dirname "$0")/../../.."
AB_VARIANTS=default,bits11,reg11,stream11,wide8,wide11,wide11_nofilter,splits2,wide11_splits2,wide11_splits4,wide11_splits16
AB_SHAPES=64x4096,64x16384,64x65536,1x4096,1x65536,8x16384
# --occupancy-of: the sm_89 path also at sm_89's blocks per SM (sparsemla_sm89path_t38occ_graph; native ignores it)
DECODE=(--batches 1,8,32,64,128 --heads 8,64,128 --extra-topks 512 --prefill-rows 1024,8192 --occupancy-of sm_89)
INDEXER=(--batches 1,64 --ctxs 4096,16384,65536 --caps 65536 --providers sparsemla_graph,sparsemla_topk_graph)
TOPK=()  # the formal run's own grid (benchmarks/topk.py defaults), so every replayed launch has its cubin
# `opaque`: V4 decode tiles that the opaque bf16 move lets fit (one shared copy of the gathered tile), sm_89 path.
# Its first sweep (decode_t38_configs_sm89o-h200.json: 1-128 rows) found 32 x 64 x 4 warps faster than the choice at
# B = 128 H = 64 (83.5 / 102.1 us); this one asks the same of the large and prefill-sized rows before the choice moves.
DCFG89O=auto,32:64:4:1:1c,32:64:8:1:1c,16:64:8:1:1c
DCFG89O_SHAPES=64x64,128x64,256x64,1024x64,8192x64,128x128,1024x8
# (`occ` and `occ2`, the twenty-second session's occupancy-matched sweeps of the sm_89 path's decode tiles and split
# counts, ran at 02f172c: decode_t38_configs_sm89_occupancy-h200.json, _occupancy2-h200.json; concluded in 18ebfcc)
# `occ3`: the launcher after `occ` / `occ2` (exact shared memory of the opaque tiles in the split count, 32 x 16 tiles
# from 256 programs where an SM holds one 32 x 32 program) against its choices before, forced (`/sN`), at sm_89's and
# at sm_80's blocks per SM
DCFGOCC3_89=auto,16:32:4:1:1c/s1,16:32:4:1:1c/s2,16:32:4:1:1c/s4,16:32:4:1:1c/s8,32:32:4:1:1c/s1
DCFGOCC3_89_SHAPES=16x8,32x8,64x8,128x8,64x16,128x64,64x128,256x64,1024x64
DCFGOCC3_80=auto,32:32:4:1:1c/s1,32:32:4:1:1c/s3,32:32:4:1:1c/s6,32:32:4:1:1c/s16
DCFGOCC3_80_SHAPES=2x64,8x64,16x64,32x64,8x128,16x128
# `wide`: the launcher's wide launch (topk.TopkLaunch, default since the twenty-first session) against the 8-warp
# launch before it, forced (wide=False). The rounds that chose it (`coarse1` at 464c4ec..650bc78, the coarse-digit
# and wide variants: topk_coarse1_ab*-native-h200.json) are concluded.
WIDE_VARIANTS=default,narrow
# session 41: streaming 8-warp participants (one wave at B = 64 x 64k) in 1k-4k pieces, with and without prefetch
STREAMPF_VARIANTS=default,st4_b1024,st4_b1024_pf,st4_b2048_pf,st4_b4096_pf,st8_b2048_pf
STREAMPF_SHAPES=64x65536,64x16384,32x65536,64x4096,8x65536
# then the same look-ahead in the launches that stream by default: k = 1024 spans (never held in registers)
STREAMPF2_VARIANTS=default,spf,spf_b2048
STREAMPF2_SHAPES=8x65536,64x65536,64x16384,1x65536
STREAMPF2_KS=1024
WIDE_SHAPES=64x4096,64x16384,64x65536,32x16384,32x65536,128x16384,8x16384
# session 43: the package's top-k spans in shared memory (topk_smem, smem=True) against the launcher's register spans
SMEM_VARIANTS=${SMEM_VARIANTS:-default,regs,smem}  # `default`: smem_spans' choice (SMEM_SPANS)
SMEM_SHAPES=${SMEM_SHAPES:-32x65536,48x65536,64x65536,96x65536,128x65536,64x16384,8x65536}
# session 45: rows up to 16k in the register launch and longer ones in shared memory on a forked stream
# (topk.LENGTH_SPLIT) against each kernel alone, at issue #15's B = 64 points (cap 64k) and B = 128 x 64k
SPLIT_VARIANTS=${SPLIT_VARIANTS:-regs,smem,split}
SPLIT_SHAPES=${SPLIT_SHAPES:-64x4096,64x16384,64x65536,128x65536,64x65536r,128x65536r,64x1024}  # r: lengths 1..ctx
# (`fork`, session 46's A/B of the split's fork and DIRECT_SLOTS, ran at 1d4ce53: topk_fork_ab-native-h200-1d4ce53.json;
# concluded and removed)
# (`scan`, session 47's LENGTH_SPLIT_SCAN -- the split's shared-memory programs read every length before their start
# ticket -- ran in session 48 at ce7efee: topk_scan_ab-native-h100-ce7efee.json; +0.2 us at 16k, -0.4..0.8 at 64k;
# removed)
# `w2d` (sessions 47-48): the winners' compaction ranked over a [ROW / C, C] view (topk_winners2d.py: a generated copy
# of topk.py with WINNERS_COLS = C, run as the A/B's `old`) against the package's. At ce7efee (one scan, the package
# then) C = 32 and 128 ran: topk_w2d32_ab-native-h100-ce7efee.json, topk_w2d128_ab-native-h100-ce7efee.json; 32 was
# adopted. Now C = 8, 16 and 65536 (the one scan of before) against the package's 32
W2D_COLS=${W2D_COLS:-8 16 65536}
W2D_VARIANTS=${W2D_VARIANTS:-default,old}
W2D_SHAPES=${W2D_SHAPES:-64x16384,64x4096,64x1024,8x16384,1x16384,64x65536r,128x65536r}
W2D_KS=${W2D_KS:-2048,512}
# (session 44-45's `packed` / `direct` A/Bs -- the shared-memory spans' counts packed into one CTA-wide sum, page slots
# written with the winners, a participant per 8k / 16k keys, 5- to 7-bit radix digits -- ran at e2b3370 with the code
# of that commit: topk_direct_ab-native-h100-e2b3370.json; each slower than the kernel before; removed)
# (session 43's `lanes` A/B -- the first radix pass in sub-histograms by lane -- ran at 729449b:
# topk_lanes_ab-native-h100-729449b.json, slower; removed)
# (session 43's `slabs` A/B -- histograms through per-participant slabs, the second pass ahead -- ran at 1286052 with
# the code of that commit: topk_slabs_ab-native-h100-1286052.json, no gain; removed)
# (`wide2` and `wide3`, the twenty-second session's candidates -- 16k rows in two 8k or four 4k register spans, 64k
# rows in eight 8k spans, the two-level winner scan -- ran at 02f172c: topk_wide2_ab-native-h200.json,
# topk_wide3_ab-native-h200.json; the 4k spans won only where 16 - 32 rows of 16k leave SMs idle and lost on 64k rows
# of the same capacity, the rest lost or tied: concluded and removed with the code of 4ef5688 / 5421507)
# `gluonws`: the sm_90 Gluon tile synchronous against warp-specialized. WS_MIN_TILES (4) leaves H = 64 B = 32 (3
# tiles a program, 4 splits) synchronous; 32x64 asks whether 3 tiles already pay, 16x64 / 8x128 (1-2 tiles) and 32x128
# (5 tiles, WS by default) bracket it
GLUONWS_SHAPES=${GLUONWS_SHAPES:-32x64,16x64,8x128,32x128}
# `ws`: the V4 decode tile with its 512 dims split over the warps (one chunk per warp through a batched dot;
# warp_split_decode.py, ahead of time: warp_split_decode_aot-t38-2026-12-04.json) against the launcher's kernel on
# the same tile and split count: Triton 3.6 JIT, 3.8 cubins (`build-ws`) and, in the sm_89 path, 3.8 cubins at
# sm_89's blocks per SM with its tiles and split counts. Native: where its tiles are mma.sync (<= 16 heads).
WS_VARIANTS=ws4,ws4t,ws8t
WS_SHAPES_SM89=1x64,64x64,128x64,1024x64,64x128,64x8
WS_SHAPES_NATIVE=64x8,64x16,128x16
# `lazy`: the online softmax's lazy rescale (DecodeConfig / V32Config.lazy_rescale: the accumulator is rescaled only
# when a head's maximum passes the reference by more than 8 in log2 units; ahead of time it skips 64-128 multiplies a
# thread per tile, 5-9 % of the loop) on the launcher's tiles: V4 in both paths (3.6 JIT, 3.8 cubins from
# `build-lazy`, and at sm_89's blocks per SM), V3.2 in both paths (3.6 JIT and 3.8 cubins,
# benchmarks.explore_v32_configs). Judge by the 3.8 rows: 3.6 spills 752-816 B a thread on sm_90's 64-head tiles
# with the lazy branch, 3.8 none.
# `sub`: 64-token tiles as two half tiles (DecodeConfig.sub_tiles: P staged half at a time, so the 32 x 64 tile is
# 100,352 B and fits sm_86/89/120; whole it needs 102,400) against the launcher in the sm_89 path
SUB_SHAPES=64x64,128x64,256x64,1024x64,8192x64,64x128,128x128,64x8,1024x8
# `h64`: 64 heads x 32 tokens in two half tiles, 8 warps (100,352 B on sm_86/89/120): one gather and dequant per 64
# heads instead of two 32-head programs each gathering the same rows -- and `sub2j`, the launcher's half tiles with
# one row-max and one row-sum reduction over both halves: aimed at the prefill rows' 1.33-1.35x
H64_SHAPES=64x64,128x64,1024x64,8192x64,64x128
# `hfast`: the launcher with a row's head blocks adjacent in the grid (DecodeConfig.heads_fastest): the benchmark's
# rows gather disjoint tokens (383 MB at 1024 rows), so today a row's second 32-head program finds them gone from L2
HF_SHAPES=64x64,128x64,256x64,1024x64,8192x64,64x128,128x128
# `hf32`: the V3.2 decode's chosen tiles with a row's head blocks adjacent in the grid (V32Config.heads_fastest)
HF32=64x64-w8-s3-c4,64x64-w8-s3-c4-hf,64x64-w8-s2-c4,64x64-w8-s2-c4-hf,32x32-w4-s2-c4-opaque,32x32-w4-s2-c4-opaque-hf
HF32_SHAPES=64:128:fp8_656,128:128:fp8_656,256:128:fp8_656,128:128:bf16_576
LAZY_SHAPES=1x64,8x64,64x64,128x64,1024x64,64x128,128x128,64x8
LAZY_V32=64x64-w8-s3-c4,64x64-w8-s2-c4,16x32-w4-s3-c4-opaque,32x32-w4-s2-c4-opaque
LAZY_V32_SHAPES=8:128:fp8_656,64:128:fp8_656,128:128:fp8_656,64:16:fp8_656,128:16:fp8_656,64:128:bf16_576
# `lift`: the integer dequant's 2^-120 folded into the tile's scale multiply, q and the output lifted by 2^8 instead
# (DecodeConfig / V32Config.q_lift, on by default since the twenty-fourth session; ahead of time -5.6 % of the sm_89
# 32 x 32 loop's instructions, -5.2 % of V3.2's sm_89 64 x 128 loop) against the same kernels without it: V4 in both
# code paths from 3.8 cubins (`build-lift`; the sm_89 path also at sm_89's blocks per SM), V3.2 in both paths (3.6
# JIT and 3.8 cubins), after the decode GPU tests of both paths. `err` of `nolift` against `base` is 0 where B > 8.
LIFT_SHAPES=1x64,8x64,32x64,64x64,128x64,1024x64,64x128,128x128,64x8,32x8
LIFT_V32=64x64-w8-s3-c4,64x64-w8-s3-c4-lift,16x32-w4-s3-c4-opaque,16x32-w4-s3-c4-opaque-nolift
LIFT_V32+=,32x32-w4-s2-c4-opaque,32x32-w4-s2-c4-opaque-nolift
LIFT_V32_SHAPES=64:128:fp8_656,128:128:fp8_656,64:16:fp8_656,8:128:fp8_656,128:16:fp8_656
# `pf`: the rows of a tile a few tiles ahead prefetched into L2 (DecodeConfig / V32Config.l2_prefetch, off by
# default; prefetch.global.L2, every target): the V4 decode has no software pipeline (1 stage: each tile's gather
# waits on memory), the V3.2 wgmma tile 3 stages in 231,424 B (2 -> 3 stages was 238 -> 191 us at B = 64 H = 128).
# Ahead of time (3.8) it adds 45-120 instructions a thread per tile (2-3 prefetches; paging_prefetch_aot-*.json).
# V4 in both paths from 3.8 cubins (`build-pf`; sm_89 path also at sm_89's blocks per SM), V3.2 in both paths.
PF_VARIANTS=pf1,pf2,pf3
PF_SHAPES=1x64,8x64,64x64,128x64,1024x64,64x128,64x8
PF_V32=64x64-w8-s3-c4,64x64-w8-s3-c4-pf1,64x64-w8-s3-c4-pf2,64x64-w8-s3-c4-pf1s32,32x32-w4-s2-c4-opaque
PF_V32+=,32x32-w4-s2-c4-opaque-pf1,32x32-w4-s2-c4-opaque-pf2,16x32-w4-s3-c4-opaque,16x32-w4-s3-c4-opaque-pf1
PF_V32_SHAPES=8:128:fp8_656,64:128:fp8_656,128:128:fp8_656,64:16:fp8_656,64:128:bf16_576
# (`late`, V32Config.late_scale -- K's fp32 scale on the scores and P -- ran at 1f0fdf4: v32_configs_late-*-h200-
# 2026-12-05.json, slower; the code was removed after 6c92a05.)
# `fused`: the fused logits + top-k launch (B = 1 4k target) next to the unfused top-k default
FUSED_VARIANTS=default,fused
FUSED_SHAPES=1x4096,8x4096
# (the `coarse` mode, the coarse-digit A/B, ran at bec8b17: topk_coarse_ab-native-h200.json; the selection lost and
# was removed)

ab_build() {  # NAME: the cubins of the top-k A/B NAME (its ${NAME^^}_VARIANTS x _SHAPES x _KS) into .gpu-cubins/NAME
    local variants="${1^^}_VARIANTS" shapes="${1^^}_SHAPES" ks="${1^^}_KS"
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_split_regs_ab.py --build-cubins ".gpu-cubins/$1" \
        --ks "${!ks:-512,2048}" --variants "${!variants}" --shapes "${!shapes}"
}
occ_build() {  # VAR TARGET: the cubins of the decode configs ${VAR} x ${VAR}_SHAPES (sm_89 path, TARGET's launches)
    local shapes="${1}_SHAPES"
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/decode_t38_configs.py --path sm89 \
        --build-cubins ".gpu-cubins/${1,,}" --configs "${!1}" --shapes "${!shapes}" --occupancy-of "$2" | grep -v '^\['
}
occ_run() {  # VAR TARGET JSON LIMIT_S: those configs in the sm_89 path at the H200's and at TARGET's blocks per SM
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    local shapes="${1}_SHAPES"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    TRITON_OVERRIDE_ARCH=sm89 timeout "$4" python3 results/bench/explore/decode_t38_configs.py --path sm89 \
        --cubins ".gpu-cubins/${1,,}" --configs "${!1}" --shapes "${!shapes}" --only-t38 --occupancy-of "$2" \
        --code "$SHA" --out "$OUT/$3" | cut -c1-200
}
ab_run() {  # NAME JSON LIMIT_S: that A/B from its cubins on the device machine, every output checked against torch.topk
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    local variants="${1^^}_VARIANTS" shapes="${1^^}_SHAPES" ks="${1^^}_KS"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    timeout "$3" python3 results/bench/explore/topk_split_regs_ab.py --cubins ".gpu-cubins/$1" --ks "${!ks:-512,2048}" \
        --variants "${!variants}" --shapes "${!shapes}" --code "$SHA" --out "$OUT/$2" | cut -c1-200
}

gpu_tag() {  # h200 / h100 / ...: the device tool may lend an H100 for a call that asks for none in particular
    nvidia-smi --query-gpu=name --format=csv,noheader | head -1 | grep -oiE 'h[0-9]+' | tr 'A-Z' 'a-z' || echo gpu
}
sm89_variant_build() {  # NAME VARIANTS SHAPES: warp_split_decode.py's V4 VARIANTS in the sm_89 path only (also at
    # sm_89's blocks per SM) into .gpu-cubins/NAME/sm89
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/warp_split_decode.py --build-cubins ".gpu-cubins/$1/sm89" \
        --path sm89 --shapes "$3" --variants "$2" --occupancy-of sm_89
    du -sh ".gpu-cubins/$1"
}
sm89_variant_run() {  # NAME VARIANTS SHAPES STEM LIMIT_S: sm89_variant_build's cubins timed (3.8 only, also at sm_89's
    # blocks per SM) -> $OUT/STEM-sm89-<gpu>.json
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    TRITON_OVERRIDE_ARCH=sm89 timeout "$5" python3 results/bench/explore/warp_split_decode.py --bench sm89 \
        --shapes "$3" --variants "$2" --cubins ".gpu-cubins/$1/sm89" --occupancy-of sm_89 --only-t38 \
        --git-sha "$SHA" --out "$OUT/$4-sm89-$(gpu_tag).json" | cut -c1-160
}
variant_build() {  # NAME VARIANTS SHAPES V32_ONLY V32_SHAPES: the V4 decode's launcher and warp_split_decode.py's
    # VARIANTS at SHAPES in both paths (the sm_89 path also at sm_89's blocks per SM) into .gpu-cubins/NAME, then
    # the V3.2 configs V32_ONLY (none when empty) into .gpu-cubins/NAME_v32
    local ws=results/bench/explore/warp_split_decode.py
    PYTHONPATH=src:. .venv/bin/python $ws --build-cubins ".gpu-cubins/$1/sm89" --path sm89 --shapes "$3" \
        --variants "$2" --occupancy-of sm_89
    PYTHONPATH=src:. .venv/bin/python $ws --build-cubins ".gpu-cubins/$1/native" --path native --shapes "$3" \
        --variants "$2"
    if [ -n "$4" ]; then
        for p in native sm89; do
            PYTHONPATH=src:. .venv/bin/python -m benchmarks.explore_v32_configs --build-cubins ".gpu-cubins/${1}_v32" \
                --path $p --only "$4" --exact --splits auto --shapes "$5"
        done
    fi
    du -sh .gpu-cubins/"$1"*
}
v4_variant_run() {  # NAME VARIANTS SHAPES STEM LIMIT_S: variant_build's V4 cubins timed in both code paths (3.8 only;
    # the sm_89 path also at sm_89's blocks per SM) -> $OUT/STEM-{native,sm89}-h200.json
    local ws=results/bench/explore/warp_split_decode.py
    timeout "$5" python3 $ws --bench native --shapes "$3" --variants "$2" --cubins ".gpu-cubins/$1/native" \
        --only-t38 --git-sha "$SHA" --out "$OUT/$4-native-h200.json" | cut -c1-160
    TRITON_OVERRIDE_ARCH=sm89 timeout "$5" python3 $ws --bench sm89 --shapes "$3" --variants "$2" \
        --cubins ".gpu-cubins/$1/sm89" --occupancy-of sm_89 --only-t38 --git-sha "$SHA" \
        --out "$OUT/$4-sm89-h200.json" | cut -c1-160
}
v32_variant_run() {  # NAME V32_ONLY V32_SHAPES LIMIT_S: variant_build's V3.2 configs in both paths (3.8 cubins)
    local p env
    for p in native sm89; do
        env=()
        [ $p = sm89 ] && env=(env TRITON_OVERRIDE_ARCH=sm89)
        "${env[@]}" timeout "$4" python3 -m benchmarks.explore_v32_configs --only "$2" --exact --only-t38 \
            --splits auto --shapes "$3" --cubins ".gpu-cubins/${1}_v32" --git-sha "$SHA" --out-dir "$OUT/v32_$1" \
            | tail -2
    done
}

case "${1:-}" in
build-ab)  # the cubins of `run` (the digit-width A/B of session 17, concluded; 27 MB: build only to rerun it)
    ab_build ab
    ;;
build)  # what the other modes replay (carry limit: 64 MiB with the tree and .gpu; `run` needs `build-ab` too)
    export PYTHONPATH=src:.
    py=.venv/bin/python
    $py -m benchmarks.decode --build-cubins .gpu-cubins/decode "${DECODE[@]}" --paths native,sm89
    $py -m benchmarks.indexer --build-cubins .gpu-cubins/indexer "${INDEXER[@]}" --paths native,sm89
    $py -m benchmarks.decode_v32 --build-cubins .gpu-cubins/decode_v32 --paths native,sm89
    $py -m benchmarks.topk --build-cubins .gpu-cubins/topk --paths native,sm89 ${TOPK[@]+"${TOPK[@]}"}
    ab_build fused
    $py results/bench/explore/decode_t38_configs.py --build-cubins .gpu-cubins/dcfg89o --path sm89 \
        --configs "$DCFG89O" --shapes "$DCFG89O_SHAPES" | grep -v '^\['
    du -sh .gpu-cubins
    ;;
build-decode)  # only the formal decode runs' cubins (`paths-decode`, `v32`): after a decode kernel changed
    PYTHONPATH=src:. .venv/bin/python -m benchmarks.decode --build-cubins .gpu-cubins/decode "${DECODE[@]}" \
        --paths native,sm89
    PYTHONPATH=src:. .venv/bin/python -m benchmarks.decode_v32 --build-cubins .gpu-cubins/decode_v32 --paths native,sm89
    ;;
build-next)  # what the next device session replays: `pf`, `paths-decode`, `v32`, `lift`, `ws` (decode sets rebuilt)
    rm -rf .gpu-cubins/{pf,pf_v32,decode,decode_v32,lift,lift_v32,ws}
    for mode in build-pf build-decode build-lift build-ws; do
        bash results/bench/explore/gpu_t38.sh $mode || exit 1
    done
    ;;
run)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    ab=results/bench/explore/topk_split_regs_ab.py
    timeout 260 python3 $ab --cubins .gpu-cubins/ab --ks 512,2048 --variants "$AB_VARIANTS" --shapes "$AB_SHAPES" \
        --code "$SHA" --out "$OUT/topk_t38_ab-native-h200.json" | cut -c1-200
    timeout 150 python3 $ab --ks 512,2048 --variants default,wide11 --shapes 64x16384,64x65536,1x4096 \
        --code "$SHA" --out "$OUT/topk_t36_ab-native-h200.json" | cut -c1-200
    timeout 130 python3 -m benchmarks.decode --cubins .gpu-cubins/decode "${DECODE[@]}" --prefill-rows "" \
        --paths native --providers sparsemla --git-sha "$SHA" --out-dir "$OUT/decode_t38" | tail -20
    ;;
v32)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    timeout 570 python3 -m benchmarks.decode_v32 --cubins .gpu-cubins/decode_v32 --paths native,sm89 \
        --git-sha "$SHA" --out-dir "$OUT/decode_v32" | tail -40
    ;;
f16)  # session 36: the V3.2 Triton tiles in f16 (V32Config.f16) against the chosen ones, 3.8 cubins only
    # (build: benchmarks.explore_v32_configs --build-cubins .gpu-cubins/f16 --path sm89|native, the names below), then
    # the V3.2 GPU tests in both paths
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    v32cfg() {  # PATH(native|sm89) NAMES SHAPES OUTDIR
        local arch=()
        [ "$1" = sm89 ] && arch=(env TRITON_OVERRIDE_ARCH=sm89)
        timeout "${F16_LIMIT_S:-100}" "${arch[@]}" python3 -m benchmarks.explore_v32_configs --cubins .gpu-cubins/f16 \
            --only-t38 --exact --only "$2" --splits auto --shapes "$3" --git-sha "$SHA" --out-dir "$OUT/$4" | tail -12
    }
    v32cfg sm89 32x32-w4-s2-c4-opaque,32x32-w4-s2-c4-opaque-f16,32x32-w4-s2-c4-cvt-opaque-f16 \
        1:128:fp8_656,8:128:fp8_656,64:128:fp8_656,128:128:fp8_656 f16_sm89_h128
    v32cfg sm89 16x32-w4-s3-c4-opaque,16x32-w4-s3-c4-opaque-f16,16x32-w4-s3-c4-cvt-opaque-f16 \
        1:16:fp8_656,64:16:fp8_656,128:16:fp8_656 f16_sm89_h16
    v32cfg native 64x64-w8-s3-c4,64x64-w8-s3-c4-f16,64x64-w8-s3-c4-cvt-f16 1:128:fp8_656,4:128:fp8_656 f16_native_h128
    v32cfg native 16x32-w4-s3-c4-opaque,16x32-w4-s3-c4-opaque-f16,16x32-w4-s3-c4-cvt-opaque-f16 \
        1:16:fp8_656,64:16:fp8_656 f16_native_h16
    PATH_LIMIT_S=${F16_TESTS_LIMIT_S:-150} OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh both \
        tests/test_sparse_decode_v32_gpu.py | grep -E 'passed|failed|error|rc='
    ;;
paths | paths-decode | paths-indexer)  # `paths` both in one call; with H = 8 and the occupancy-matched provider the
    # decode grid may need a call of its own (paths-decode, then paths-indexer)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    if [ "$1" != paths-indexer ]; then
        timeout "${DECODE_LIMIT_S:-330}" python3 -m benchmarks.decode --cubins .gpu-cubins/decode "${DECODE[@]}" \
            --paths native,sm89 --providers sparsemla,flashmla --git-sha "$SHA" --out-dir "$OUT/decode_paths" | tail -30
    fi
    if [ "$1" != paths-decode ]; then
        timeout "${INDEXER_LIMIT_S:-200}" python3 -m benchmarks.indexer --cubins .gpu-cubins/indexer "${INDEXER[@]}" \
            --paths native,sm89 --git-sha "$SHA" --out-dir "$OUT/indexer_paths" | tail -20
    fi
    ;;
opaque)  # the V4 decode tiles the opaque bf16 move lets fit, at large and prefill-sized rows (3.8 cubins, sm_89
    # path). (Its V3.2 opaque_k and indexer opaque_bf16 parts ran at 2c027e9: v32_configs_opaque-*.json, adopted;
    # indexer_opaque_ab-sm89-h200.json, slower, off.)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    TRITON_OVERRIDE_ARCH=sm89 timeout 300 python3 results/bench/explore/decode_t38_configs.py --path sm89 \
        --cubins .gpu-cubins/dcfg89o --configs "$DCFG89O" --shapes "$DCFG89O_SHAPES" --only-t38 --code "$SHA" \
        --out "$OUT/decode_t38_configs_sm89o_large-h200.json" | cut -c1-200
    ;;
build-ws)  # the cubins of `ws` (both paths)
    ws=results/bench/explore/warp_split_decode.py
    PYTHONPATH=src:. .venv/bin/python $ws --build-cubins .gpu-cubins/ws/sm89 --path sm89 --shapes "$WS_SHAPES_SM89" \
        --variants "$WS_VARIANTS" --occupancy-of sm_89
    PYTHONPATH=src:. .venv/bin/python $ws --build-cubins .gpu-cubins/ws/native --path native \
        --shapes "$WS_SHAPES_NATIVE" --variants "$WS_VARIANTS"
    du -sh .gpu-cubins/ws
    ;;
build-lazy)  # the cubins of `lazy` (V4 and V3.2, both paths)
    variant_build lazy lazy "$LAZY_SHAPES" "$LAZY_V32" "$LAZY_V32_SHAPES"
    ;;
lazy)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    ws=results/bench/explore/warp_split_decode.py
    timeout 170 python3 $ws --bench native --shapes "$LAZY_SHAPES" --variants lazy --cubins .gpu-cubins/lazy/native \
        --git-sha "$SHA" --out "$OUT/lazy_rescale-native-h200.json" | cut -c1-160
    TRITON_OVERRIDE_ARCH=sm89 timeout 200 python3 $ws --bench sm89 --shapes "$LAZY_SHAPES" --variants lazy \
        --cubins .gpu-cubins/lazy/sm89 --occupancy-of sm_89 --git-sha "$SHA" --out "$OUT/lazy_rescale-sm89-h200.json" \
        | cut -c1-160
    timeout 110 python3 -m benchmarks.explore_v32_configs --only "$LAZY_V32" --splits auto --shapes "$LAZY_V32_SHAPES" \
        --cubins .gpu-cubins/lazy_v32 --git-sha "$SHA" --out-dir "$OUT/v32_lazy" | tail -3
    TRITON_OVERRIDE_ARCH=sm89 timeout 110 python3 -m benchmarks.explore_v32_configs --only "$LAZY_V32" --splits auto \
        --shapes "$LAZY_V32_SHAPES" --cubins .gpu-cubins/lazy_v32 --git-sha "$SHA" --out-dir "$OUT/v32_lazy" | tail -3
    ;;
build-lift)  # the cubins of `lift` (V4 and V3.2, both paths; LIFT_SKIP_V32=1: V4 only)
    [ "${LIFT_SKIP_V32:-0}" = 1 ] && LIFT_V32=
    variant_build lift nolift,lift "$LIFT_SHAPES" "$LIFT_V32" "$LIFT_V32_SHAPES"
    ;;
lift)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    v4_variant_run lift nolift,lift "$LIFT_SHAPES" q_lift 130
    [ "${LIFT_SKIP_TESTS:-0}" = 1 ] || PATH_LIMIT_S=110 OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh both \
        tests/test_sparse_decode_gpu.py tests/test_sparse_decode_v32_gpu.py | grep -E 'passed|failed|error|rc='
    [ "${LIFT_SKIP_V32:-0}" = 1 ] && exit 0  # a short call: V4 and the tests only
    v32_variant_run lift "$LIFT_V32" "$LIFT_V32_SHAPES" 75
    ;;
build-pf)  # the cubins of `pf` (V4 and V3.2, both paths)
    variant_build pf "$PF_VARIANTS" "$PF_SHAPES" "$PF_V32" "$PF_V32_SHAPES"
    ;;
build-sub)  # the cubins of `sub` (sm_89 path only: the half tiles are for mma.sync targets)
    sm89_variant_build sub sub2 "$SUB_SHAPES"
    ;;
sub)  # V4 decode, sm_89 path: the launcher against 64-token tiles as two half tiles (DecodeConfig.sub_tiles), at the
    # H200's and at sm_89's blocks per SM, then the sub-tile GPU tests in both paths
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    sm89_variant_run sub sub2 "$SUB_SHAPES" sub_tiles 240
    PATH_LIMIT_S=60 OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh both tests/test_sparse_decode_gpu.py \
        -k sub_tiles | grep -E 'passed|failed|error|rc='
    ;;
build-h64)  # the cubins of `h64` (sm_89 path)
    sm89_variant_build h64 h64sub2,sub2j "$H64_SHAPES"
    ;;
h64)  # V4 decode, sm_89 path: 64 heads x 32 tokens in half tiles (8 warps, 100,352 B) and the half tiles' joint
    # reductions (DecodeConfig.sub_joint_reduce) against the launcher
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    sm89_variant_run h64 h64sub2,sub2j "$H64_SHAPES" h64_sub2 150
    ;;
build-w8)  # the cubins of `w8` (sm_89 path)
    sm89_variant_build w8 w8 "$H64_SHAPES"
    ;;
w8)  # V4 decode, sm_89 path (session 49, not yet run): the launcher's tile with 8 warps against 4. Ahead of time on
    # sm_89 (32 x 64 half tiles): 178 registers and no spill against 255 and 48 B, 1,200 loop instructions a thread
    # against 1,866, but 50 % more HMMAs in all (both warp groups compute the scores). Aimed at the prefill rows
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    sm89_variant_run w8 w8 "$H64_SHAPES" w8 200
    ;;
build-hfast)  # the cubins of `hfast` (sm_89 path)
    sm89_variant_build hfast hfast "$HF_SHAPES"
    ;;
hfast)  # V4 decode, sm_89 path: the launcher with a row's head blocks adjacent in the grid against the launcher
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    sm89_variant_run hfast hfast "$HF_SHAPES" heads_fastest 150
    ;;
build-hf32)  # the cubins of `hf32` (V3.2, both paths)
    for p in native sm89; do
        PYTHONPATH=src:. .venv/bin/python -m benchmarks.explore_v32_configs --build-cubins .gpu-cubins/hf32_v32 \
            --path $p --only "$HF32" --exact --splits auto --shapes "$HF32_SHAPES"
    done
    du -sh .gpu-cubins/hf32_v32
    ;;
hf32)  # V3.2 decode, both paths: the chosen tiles with and without the head-blocks-first grid
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    v32_variant_run hf32 "$HF32" "$HF32_SHAPES" 150
    ;;
gluon)  # V4 decode, native path: the Gluon tile (explore/gluon_decode.py: the two warpgroups split the scores'
    # tokens) against the launcher, both from Triton 3.8 cubins (build: gluon_decode.py build); first what the GPU
    # machine's Triton offers of Gluon's Hopper API
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    python3 -c "import triton; from triton.experimental.gluon.language.nvidia import hopper; \
from triton.experimental.gluon import language as gl; print(triton.__version__, sorted(n for n in dir(hopper) \
if not n.startswith('_')), 'barrier' in dir(gl), 'warp_specialize' in dir(gl))" 2>&1 | tail -2
    timeout "${GLUON_LIMIT_S:-200}" python3 results/bench/explore/gluon_decode.py bench --cubins .gpu-cubins/gluon \
        --git-sha "$SHA" --out "$OUT/gluon_decode-native-$(gpu_tag).json" | cut -c1-200
    ;;
gluon32)  # V3.2 decode (fp8_656, H = 128, top-k 2048), native path: the Gluon tile (explore/gluon_decode_v32.py)
    # against the launcher, both from Triton 3.8 cubins (build: gluon_decode_v32.py build). Next (session 33, not run):
    # GLUON32_VARIANTS=base,gluon,pkg_gluon,pkg_gluon_cvt,pkg_gluon_pf,pkg_gluon_pf_cvt,flashmla (pkg_* = the package's
    # V32Config.gluon tile through its launcher, _pf its gather one tile ahead; FlashMLA beside them)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    timeout "${GLUON_LIMIT_S:-200}" python3 results/bench/explore/gluon_decode_v32.py bench \
        --cubins .gpu-cubins/gluon_v32 --git-sha "$SHA" --out "$OUT/gluon_decode_v32-native-$(gpu_tag).json" \
        ${GLUON32_SHAPES:+--shapes "$GLUON32_SHAPES"} ${GLUON32_VARIANTS:+--variants "$GLUON32_VARIANTS"} | cut -c1-200
    ;;
v32g)  # session 33's V3.2 Gluon tile in one call: `gluon32` with the package's tile (V32Config.gluon, synchronous and
    # prefetching) next to the explore prototypes and FlashMLA, then the V3.2 GPU tests (native path; its Gluon tests
    # run there). Build first: gluon_decode_v32.py build; carry .gpu-cubins/gluon_v32 and .gpu
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    GLUON32_SHAPES=${GLUON32_SHAPES:-32x128,64x128,128x128} \
        GLUON32_VARIANTS=${GLUON32_VARIANTS:-base,gluon,pkg_gluon,pkg_gluon_pf,pkg_gluon_pf_cvt,flashmla} \
        GLUON_LIMIT_S=${GLUON_LIMIT_S:-180} bash "$0" gluon32 | grep -v masked
    PATH_LIMIT_S=${V32G_TESTS_LIMIT_S:-300} OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh native \
        tests/test_sparse_decode_v32_gpu.py | grep -E 'passed|failed|error|rc='
    ;;
build-gluonws)  # the cubins of `gluonws` at GLUONWS_SHAPES (rows x heads)
    rm -rf .gpu-cubins/gluon_ws
    PYTHONPATH=src:. .venv/bin/python results/bench/explore/gluon_ws_decode.py build --shapes "$GLUONWS_SHAPES"
    ;;
gluonws)  # V4 decode, native path: the package's Gluon tile against its warp-specialized form (explore/
    # gluon_ws_decode.py: a producer warpgroup gathers tile i + 1 while two consumer warpgroups multiply tile i), both
    # from Triton 3.8 cubins (build: gluon_ws_decode.py build); outputs must be bit-equal
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    timeout "${GLUON_LIMIT_S:-200}" python3 results/bench/explore/gluon_ws_decode.py bench \
        --cubins .gpu-cubins/gluon_ws --shapes "$GLUONWS_SHAPES" --git-sha "$SHA" \
        --out "$OUT/gluon_ws_decode-native-$(gpu_tag).json" | cut -c1-200
    ;;
mmaws)  # V4 decode, sm_89 path: the warp-specialized mma_v2 prototype (explore/gluon_mma_ws_decode.py) against the
    # launcher, both from Triton 3.8 cubins (build: gluon_mma_ws_decode.py build; Triton 3.6 cannot compile it). Ran at
    # 9b1a16d on an H100 (gluon_mma_ws_decode-sm89-h100-9b1a16d.json): 1.3-2.5x slower than the launcher, concluded
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    TRITON_OVERRIDE_ARCH=sm89 timeout "${MMAWS_LIMIT_S:-150}" python3 results/bench/explore/gluon_mma_ws_decode.py \
        bench --cubins .gpu-cubins/mma_ws --git-sha "$SHA" --out "$OUT/gluon_mma_ws_decode-sm89-$(gpu_tag).json" \
        | cut -c1-200
    ;;
next)  # one call after a decode default changed: the formal V4 decode run in both paths (`paths-decode`, FlashMLA
    # beside it; carry .gpu-cubins/decode from `build-decode` and .gpu), then the decode GPU tests of both paths
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    DECODE_LIMIT_S=${DECODE_LIMIT_S:-240} bash results/bench/explore/gpu_t38.sh paths-decode  # (sets up the machine)
    PATH_LIMIT_S=${NEXT_TESTS_LIMIT_S:-140} OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh both \
        tests/test_sparse_decode_gpu.py tests/test_sparse_decode_v32_gpu.py | grep -E 'passed|failed|error|rc='
    ;;
pf)  # the decode GPU tests of both paths first (PF_SKIP_TESTS=1: not); PF_SKIP_V4=1 / PF_SKIP_V32=1: one half
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    [ "${PF_SKIP_TESTS:-0}" = 1 ] || PATH_LIMIT_S=140 OUT="$OUT/gpu-tests" bash benchmarks/gpu-tests.sh both \
        tests/test_sparse_decode_gpu.py tests/test_sparse_decode_v32_gpu.py | grep -E 'passed|failed|error|rc='
    [ "${PF_SKIP_V4:-0}" = 1 ] || v4_variant_run pf "$PF_VARIANTS" "$PF_SHAPES" l2_prefetch 150
    [ "${PF_SKIP_V32:-0}" = 1 ] || v32_variant_run pf "$PF_V32" "$PF_V32_SHAPES" 90
    ;;
ws)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    ws=results/bench/explore/warp_split_decode.py
    TRITON_OVERRIDE_ARCH=sm89 timeout "${WS_LIMIT_S:-360}" python3 $ws --bench sm89 --shapes "$WS_SHAPES_SM89" \
        --variants "$WS_VARIANTS" --cubins .gpu-cubins/ws/sm89 --occupancy-of sm_89 --git-sha "$SHA" \
        --out "$OUT/warp_split_decode-sm89-h200.json" | cut -c1-200
    timeout 150 python3 $ws --bench native --shapes "$WS_SHAPES_NATIVE" --variants "$WS_VARIANTS" \
        --cubins .gpu-cubins/ws/native --git-sha "$SHA" --out "$OUT/warp_split_decode-native-h200.json" | cut -c1-200
    ;;
build-topk)  # the cubins of `formal` (both code paths)
    PYTHONPATH=src:. .venv/bin/python -m benchmarks.topk --build-cubins .gpu-cubins/topk --paths native,sm89 \
        ${TOPK[@]+"${TOPK[@]}"}
    du -sh .gpu-cubins/topk
    ;;
build-occ3)  # the cubins of `occ3`
    occ_build DCFGOCC3_89 sm_89
    occ_build DCFGOCC3_80 sm_80
    ;;
occ3)
    occ_run DCFGOCC3_89 sm_89 decode_t38_configs_occupancy3_sm89-h200.json 200
    occ_run DCFGOCC3_80 sm_80 decode_t38_configs_occupancy3_sm80-h200.json 200
    ;;
build-streampf|build-streampf2|build-smem|build-split)  # the cubins of those A/Bs
    ab_build "${1#build-}"
    ;;
build-wide)  # the cubins of `wide`
    ab_build "${1#build-}"
    ;;
wide)  # the wide launch's A/B from 3.8 cubins
    ab_run wide topk_wide_ab-native-h200.json 300
    ;;
smem)  # session 43: the package's shared-memory spans against the register spans, from .gpu-cubins/smem
    ab_run smem "topk_smem_ab-native-$(gpu_tag).json" 240
    ;;
split)  # session 45: the length split (LENGTH_SPLIT) against each kernel alone, from .gpu-cubins/split
    ab_run split "topk_split_ab-native-$(gpu_tag).json" "${SPLIT_LIMIT_S:-200}"
    ;;
build-w2d)  # here: each C's copy of topk.py and its cubins into .gpu-cubins/w2d<C> (the copy travels with them)
    for c in $W2D_COLS; do
        mkdir -p ".gpu-cubins/w2d$c"
        PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_winners2d.py write --cols "$c" \
            --out ".gpu-cubins/w2d$c/topk_w2d.py"
        PYTHONPATH=src:. .venv/bin/python results/bench/explore/topk_split_regs_ab.py --old ".gpu-cubins/w2d$c/topk_w2d.py" \
            --build-cubins ".gpu-cubins/w2d$c" --ks "$W2D_KS" --variants "$W2D_VARIANTS" --shapes "$W2D_SHAPES"
    done
    ;;
w2d)  # session 47: the [ROW / C, C] winners' ranks (W2D_COLS), one A/B per C, from .gpu-cubins/w2d<C>
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    for c in $W2D_COLS; do
        timeout "${W2D_LIMIT_S:-150}" python3 results/bench/explore/topk_split_regs_ab.py --old ".gpu-cubins/w2d$c/topk_w2d.py" \
            --cubins ".gpu-cubins/w2d$c" --ks "$W2D_KS" --variants "$W2D_VARIANTS" --shapes "$W2D_SHAPES" --code "$SHA" \
            --out "$OUT/topk_w2d${c}_ab-native-$(gpu_tag).json" | cut -c1-200
    done
    ;;
either48)  # session 48: one call whatever card comes. An H200: `formal native` (issue #15's run, then `formal sm89` in
    # the next call); another card: the w2d A/B, then the top-k GPU tests in both code paths (EITHER48_TESTS_S a path).
    # carry: .gpu-cubins/topk, .gpu-cubins/w2d8, .gpu-cubins/w2d16, .gpu-cubins/w2d65536, .gpu
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then
        FORMAL_LIMIT_S=${FORMAL_LIMIT_S:-540} exec bash "$0" formal native
    fi
    W2D_LIMIT_S=${W2D_LIMIT_S:-100} bash "$0" w2d
    OUT="$OUT/gpu-tests" PATH_LIMIT_S=${EITHER48_TESTS_S:-170} bash benchmarks/gpu-tests.sh both tests/test_indexer_gpu.py \
        -k topk 2>&1 | grep -E "passed|failed|error|rc=" | tail -6
    ;;
fused)  # the fused logits + top-k launch from 3.8 cubins
    ab_run fused topk_fused_ab-native-h200.json 150
    ;;
either)  # session 40: one call whatever card comes. An H200: `v32` (issue #17's formal run). An H100: EITHER_H100=
    # dsmall (default): the checks 4e90ede left (SM90_MMA_BUSY), its A/B at 128 + 2048 and 512 indices from
    # .gpu-cubins/dsmall, then the V4 decode GPU tests of the native path on Triton 3.6; tests-native|sm89|both: every
    # GPU test in that code path (benchmarks/gpu-tests.sh, EITHER_TESTS_S a path); streampf: the top-k A/B of
    # session 41 (build-streampf first)
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}"
    if nvidia-smi --query-gpu=name --format=csv,noheader | grep -q H200; then exec bash "$0" v32; fi
    case ${EITHER_H100:-dsmall} in
    tests-*)  # tests-native, tests-sm89, tests-both
        OUT="$OUT/gpu-tests" PATH_LIMIT_S="${EITHER_TESTS_S:-540}" bash benchmarks/gpu-tests.sh "${EITHER_H100#tests-}" ${EITHER_TESTS_ARGS:-}
        exit ;;
    streampf)  # session 41: the top-k's streaming participants (STREAMPF_VARIANTS) from .gpu-cubins/streampf
        ab_run streampf "topk_streampf_ab-native-$(gpu_tag).json" 400
        exit ;;
    streampf2)  # session 41: the look-ahead in the default launches' streaming spans (k = 1024), .gpu-cubins/streampf2
        ab_run streampf2 "topk_streampf2_ab-native-$(gpu_tag).json" 200
        exit ;;
    dwide)  # the sm_90 window where the extra list is wide and mostly -1 (sglang's ratio-128 layers: width cap/128,
        # ctx/128 live), from .gpu-cubins/dwide (decode_t38_configs.py --build-cubins ... --extra 8192, these configs)
        bash benchmarks/gpu-setup.sh 2>&1 | tail -1
        export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
        timeout 400 python3 results/bench/explore/decode_t38_configs.py --cubins .gpu-cubins/dwide \
            --configs auto,gluon-sync,gluon-ws,32:32:4:1:1c,32:16:4:1:1c,64:16:4:2:2c \
            --shapes 1x64,4x64,8x128,16x64,24x64,32x64,16x128 --extra 8192 --extra-valid 32,256,1024,4096 \
            --only-t38 --code "$SHA" --out "$OUT/dwide.json" | python3 -c '
import json, sys
for line in sys.stdin:
    try:
        r = json.loads(line)
    except ValueError:
        print(line.rstrip()); continue
    print(r["B"], r["H"], r.get("extra_valid"), r["cfg"], r.get("us_t38", r.get("error_t38")))'
        exit ;;
    esac
    bash benchmarks/gpu-setup.sh 2>&1 | tail -1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    for e in 2048 512; do
        timeout 80 python3 results/bench/explore/decode_t38_configs.py --cubins .gpu-cubins/dsmall \
            --configs auto,gluon,64:16:4:2:2c,32:16:4:1:1c,32:32:4:1:1c \
            --shapes 1x64,1x128,2x64,4x64,8x128,16x64,16x128,32x64,24x64 --extra "$e" --only-t38 --code "$SHA" \
            --out "$OUT/dsmall_x$e.json" | tail -14
    done
    OUT="$OUT/gpu-tests" PATH_LIMIT_S="${EITHER_TESTS_S:-300}" bash benchmarks/gpu-tests.sh native tests/test_sparse_decode_gpu.py
    ;;
formal-both)  # both code paths in one call now that --warm-workers compiles in parallel (session 49: 321 s, cold H100):
    # native first (FORMAL_NATIVE_S), then sm89 with what is left of FORMAL_TOTAL_S; a cut sm89 path leaves its rows
    # under $OUT/topk-sm89/topk-partial -- then run `formal sm89` in the next call while the machine is warm
    t0=$(date +%s)
    FORMAL_LIMIT_S=${FORMAL_NATIVE_S:-330} bash "$0" formal native
    left=$(( ${FORMAL_TOTAL_S:-575} - ($(date +%s) - t0) ))
    echo "[formal-both] native took $(( $(date +%s) - t0 )) s; sm89 gets ${left} s"
    if [ "$left" -gt 60 ]; then FORMAL_LIMIT_S=$left bash "$0" formal sm89; fi
    ;;
formal)  # one code path per device call (both with the sglang JIT build do not fit 10 minutes), then --merge here
    : "${SHA:?set SHA to the commit measured}" "${OUT:?run on the device machine}" "${2:?native or sm89}"
    # sglang's JIT top-k (the k = 2048 targets' baseline) needs its sources and apache-tvm-ffi in the carried .gpu
    if [ ! -d .gpu/sglang_src/sglang ] || ! compgen -G ".gpu/wheels/apache_tvm_ffi-*.whl" >/dev/null; then
        echo "formal: .gpu lacks sglang_src or the apache-tvm-ffi wheel: run bash benchmarks/gpu-sglang-jit.sh here" >&2
        exit 2
    fi
    bash benchmarks/gpu-setup.sh >/dev/null 2>&1
    export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1
    timeout "${FORMAL_LIMIT_S:-570}" python3 -m benchmarks.topk --paths "$2" --cubins .gpu-cubins/topk --git-sha "$SHA" \
        --warm-workers "${FORMAL_WARM:-8}" --out-dir "$OUT/topk-$2" | tail -40
    ;;
*)
    echo "usage: $0 build|build-ab|build-occ3|build-topk|build-ws|build-lazy|build-lift|build-pf|build-decode|build-next|build-sub|build-h64|build-w8|w8|build-hfast|build-hf32|run|paths|paths-decode|paths-indexer|v32|opaque|occ3|ws|lazy|lift|pf|sub|h64|hfast|hf32|gluon|gluon32|build-gluonws|gluonws|mmaws|v32g|next|fused|either|build-split|split|build-w2d|w2d|either48|formal native|sm89|formal-both" >&2
    exit 2
    ;;
esac
