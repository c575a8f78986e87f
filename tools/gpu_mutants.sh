# The mutants tools/gpu_prepare.sh builds (tools/build_mutant.sh) and tools/gpu_check.sh runs
# on a GPU: each breaks one thing, and the [cuda] case named with it must then fail (a mutant
# that passes its case is a test that needs fixing). NAME SOURCE SED_EXPRESSION CASE, four
# words each; a comma in a case name is escaped for Catch2.
# shellcheck disable=SC2034 # read by the scripts that source this file
gpu_mutants=(
  # f32 GEMMs on TF32: the tiny GPT's f32 bound.
  pipit_tests_f32_as_tf32 tensor/cuda/cuda_backend.cpp
  's/float32_matmul_precision() == "high"/true/'
  'cuda: a tiny GPT trains five steps as on the CPU\, in f32 and bf16'
  # Casts to bf16 truncating instead of rounding: the copies' bits. (The tiny GPT's bf16 bound
  # cannot see it: the same truncation on the CPU moved its losses by 6.3e-4, under 2e-3.)
  pipit_tests_bf16_truncated tensor/cuda/elementwise.cu
  's/\[\] __device__(S x) { return from_double<D>(to_double(x)); }/[] __device__(S x) { if constexpr (std::is_same_v<D, __nv_bfloat16>) { return __float2bfloat16_rz(static_cast<float>(to_double(x))); } else { return from_double<D>(to_double(x)); } }/'
  'cuda: copies between host and device\, strides and dtypes'
  # Autocast a no-op: the tiny GPT's bf16 steps must differ from its f32 ones.
  pipit_tests_autocast_noop autograd/autocast.cpp
  's/  current = dtype;/  (void)dtype;/'
  'cuda: a tiny GPT trains five steps as on the CPU\, in f32 and bf16'
  # The weight gradient's split a no-op.
  pipit_tests_split_noop tensor/cuda/cuda_backend.cpp
  's/if (parts == 1 || tiles >= kSms/if (true || tiles >= kSms/'
  'cuda: a small weight gradient split over runs of rows adds its runs in order'
  # A graph's index checks not queued again after a replay.
  pipit_tests_graph_checks_dropped tensor/cuda/index_check.cu
  's/if (s.queued.empty()) s.queued = checks;/(void)checks;/'
  'cuda: an index out of range inside a replay surfaces at synchronize'
  # A capture's blocks on the default stream's free lists.
  pipit_tests_graph_pool_shared tensor/cuda/cuda_device.cpp
  's/void\* stream = current_stream_handle(device);/void* stream = capturing() ? nullptr : current_stream_handle(device);/'
  'cuda: memory a capture allocated is not handed to other work'
  # empty_cache free to take a live graph's blocks.
  pipit_tests_graph_blocks_unkept tensor/cuda/cuda_device.cpp
  's/c.kept_streams.insert(stream);/(void)stream;/'
  'cuda: a Graph keeps its memory through empty_cache and leaves nothing once destroyed'
  # A destroyed stream's cached blocks left reserved under its dead handle.
  pipit_tests_stream_blocks_kept tensor/stream.cpp
  's/cuda::forget_stream_blocks(index, s);//'
  'cuda: a Graph keeps its memory through empty_cache and leaves nothing once destroyed'
  # Blocks that outlive their stream kept under its dead handle.
  pipit_tests_stream_generation_kept tensor/cuda/cuda_device.cpp
  's/++c.generations\[stream\];//'
  'cuda: a Graph keeps its memory through empty_cache and leaves nothing once destroyed'
)
