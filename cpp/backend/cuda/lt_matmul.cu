#include "backend/cuda/lt_matmul.h"

#include <string>

#include "backend/cuda/cuda_check.h"
#include "errors.h"

#if NINFER_HAVE_CUBLASLT
#include <cublasLt.h>
#endif

namespace ninfer::cuda {

#if NINFER_HAVE_CUBLASLT
namespace {

void check_lt(cublasStatus_t status, const char* what) {
  if (status != CUBLAS_STATUS_SUCCESS)
    throw EngineError(std::string("cuBLASLt error in ") + what + ": " + cublasLtGetStatusString(status));
}
#define NINFER_LT_CHECK(call) check_lt((call), #call)

// Owners of the per-call cuBLASLt descriptors (host objects only: nothing here touches device memory).
struct MatmulDesc {
  cublasLtMatmulDesc_t desc = nullptr;
  MatmulDesc() { NINFER_LT_CHECK(cublasLtMatmulDescCreate(&desc, CUBLAS_COMPUTE_32F, CUDA_R_32F)); }
  ~MatmulDesc() { cublasLtMatmulDescDestroy(desc); }
  template <class T>
  void set(cublasLtMatmulDescAttributes_t attribute, const T& value) {
    NINFER_LT_CHECK(cublasLtMatmulDescSetAttribute(desc, attribute, &value, sizeof(T)));
  }
};

struct Layout {
  cublasLtMatrixLayout_t layout = nullptr;
  // A column-major rows x cols matrix with leading dimension ld (cuBLASLt's convention).
  Layout(cudaDataType_t type, int64_t rows, int64_t cols, int64_t ld) {
    NINFER_LT_CHECK(cublasLtMatrixLayoutCreate(&layout, type, uint64_t(rows), uint64_t(cols), ld));
  }
  ~Layout() { cublasLtMatrixLayoutDestroy(layout); }
};

struct Preference {
  cublasLtMatmulPreference_t pref = nullptr;
  Preference() { NINFER_LT_CHECK(cublasLtMatmulPreferenceCreate(&pref)); }
  ~Preference() { cublasLtMatmulPreferenceDestroy(pref); }
  template <class T>
  void set(cublasLtMatmulPreferenceAttributes_t attribute, const T& value) {
    NINFER_LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, attribute, &value, sizeof(T)));
  }
};

// The largest power of two (at most 256) that divides the address: what the kernel may assume about it.
int alignment_of(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int align = 256;
  while (align > 1 && a % uintptr_t(align)) align /= 2;
  return align;
}

// Everything cuBLASLt needs to describe the problem. In its column-major terms: D (n x m, ld ldy) =
// op(A) * B with A = w seen as a k x n matrix (ld k) transposed, and B = x seen as a k x m matrix (ld k).
struct Described {
  MatmulDesc desc;
  Layout a, b, d;
  explicit Described(const LtProblem& p)
      : a(p.operands == LtOperands::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, p.k, p.n, p.k),
        b(p.operands == LtOperands::E4M3 ? CUDA_R_8F_E4M3 : CUDA_R_16BF, p.k, p.m, p.k),
        d(CUDA_R_32F, p.n, p.m, p.ldy) {
    desc.set(CUBLASLT_MATMUL_DESC_TRANSA, CUBLAS_OP_T);
    desc.set(CUBLASLT_MATMUL_DESC_TRANSB, CUBLAS_OP_N);
    if (p.scaling == LtScaling::OuterVector) {
      const int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_MODE, mode);  // one scale per row of op(A): per weight row
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_MODE, mode);  // one scale per column of B: per activation row
      desc.set(CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, static_cast<const void*>(p.w_scale));
      desc.set(CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, static_cast<const void*>(p.x_scale));
    }
  }
};

}  // namespace

struct LtMatmul::Algorithm {
  bool found = false;
  cublasLtMatmulAlgo_t algo{};
};

bool LtMatmul::available() { return true; }

LtMatmul::LtMatmul() = default;

LtMatmul::~LtMatmul() {
  if (handle_) cublasLtDestroy(static_cast<cublasLtHandle_t>(handle_));
}

const LtMatmul::Algorithm& LtMatmul::algorithm(const LtProblem& p) {
  if (!handle_) {
    cublasLtHandle_t handle = nullptr;
    NINFER_LT_CHECK(cublasLtCreate(&handle));
    handle_ = handle;
    workspace_ = DeviceBuffer(kWorkspaceBytes);
  }
  const Key key{int(p.operands), int(p.scaling), p.m, p.n, p.k, p.ldy,
                alignment_of(p.w), alignment_of(p.x), alignment_of(p.y)};
  auto it = algorithms_.find(key);
  if (it != algorithms_.end()) return *it->second;
  // Prefill chunks repeat a handful of row counts; a server that sees endless distinct ones starts over.
  if (algorithms_.size() >= 4096) algorithms_.clear();
  Described described(p);
  Preference pref;
  pref.set(CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, uint64_t(kWorkspaceBytes));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, uint32_t(std::get<6>(key)));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, uint32_t(std::get<7>(key)));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, uint32_t(std::get<8>(key)));
  pref.set(CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, uint32_t(std::get<8>(key)));
  cublasLtMatmulHeuristicResult_t result{};
  int count = 0;
  const cublasStatus_t status =
      cublasLtMatmulAlgoGetHeuristic(static_cast<cublasLtHandle_t>(handle_), described.desc.desc, described.a.layout,
                                     described.b.layout, described.d.layout, described.d.layout, pref.pref, 1,
                                     &result, &count);
  auto algorithm = std::make_unique<Algorithm>();
  algorithm->found = status == CUBLAS_STATUS_SUCCESS && count > 0 && result.state == CUBLAS_STATUS_SUCCESS;
  if (algorithm->found) algorithm->algo = result.algo;
  return *algorithms_.emplace(key, std::move(algorithm)).first->second;
}

bool LtMatmul::supports(const LtProblem& p) { return algorithm(p).found; }

bool LtMatmul::run(const LtProblem& p, cudaStream_t stream) {
  const Algorithm& algorithm = this->algorithm(p);
  if (!algorithm.found) return false;
  Described described(p);
  const float alpha = 1.0f, beta = 0.0f;
  NINFER_LT_CHECK(cublasLtMatmul(static_cast<cublasLtHandle_t>(handle_), described.desc.desc, &alpha, p.w,
                                 described.a.layout, p.x, described.b.layout, &beta, p.y, described.d.layout, p.y,
                                 described.d.layout, &algorithm.algo, workspace_.get(), workspace_.bytes(), stream));
  return true;
}

#else  // built without cuBLASLt: the prefill GEMM always takes the f32 twin

struct LtMatmul::Algorithm {};
bool LtMatmul::available() { return false; }
LtMatmul::LtMatmul() = default;
LtMatmul::~LtMatmul() = default;
bool LtMatmul::supports(const LtProblem&) { return false; }
bool LtMatmul::run(const LtProblem&, cudaStream_t) { return false; }

#endif

}  // namespace ninfer::cuda
