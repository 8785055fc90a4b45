// ppmulti's CPU convolution for training: forward and both backward passes through oneDNN.
//
// Paddle 2.6's dygraph conv2d on CPU is im2col + GEMM per image, with im2col/col2im on one thread;
// its own oneDNN kernels are only reachable from static programs. This op runs oneDNN's direct
// convolution (the primitives PyTorch's CPU conv uses) on the libdnnl that ships inside Paddle's wheel.
// Scope: float32, NCHW, any groups (depth-wise included: Paddle's CPU depthwise_conv2d is a plain loop), an
// optional bias (ppmulti_onednn_conv2d_bias), dilation 1, symmetric padding; ppmulti/rank/ops/conv.py decides
// which layers qualify.
//
// The bf16 variant (ppmulti_onednn_conv2d_bf16, for --amp on CPUs with AVX512-BF16/AMX) takes and returns
// the same float32 tensors: inputs, weights and output gradients are converted to bfloat16 by the reorders
// that already bring them into oneDNN's blocked layouts, the primitives accumulate in float32 and write
// float32 outputs and gradients, so the weights stay float32 master copies.
//
// The library also holds ppmulti_onednn_silu: SiLU forward and backward through oneDNN's eltwise swish.
// Paddle's CPU silu and its gradient are single-threaded Eigen loops (about 70 ms of a 520 ms YOLOv5n
// training step); oneDNN's kernel is vectorised and threaded, about 3x faster where fresh output pages do
// not dominate. It lives here so that one build and one loaded library serve both ops;
// ppmulti/rank/ops/silu.py decides where it runs.
//
// And ppmulti_onednn_conv2d_infer, for evaluation only (no gradient): a convolution with a bias and optionally
// SiLU as a oneDNN post-op, what a conv+BN+SiLU layer becomes once silu.py folds BatchNorm into its weights.

#include <algorithm>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "oneapi/dnnl/dnnl_config.h"
// Paddle's libdnnl is built without the experimental sparse API that the PyPI headers switch on.
#undef DNNL_EXPERIMENTAL_SPARSE
#include "oneapi/dnnl/dnnl.hpp"
#include "paddle/extension.h"
#include "paddle/phi/core/dense_tensor.h"

namespace {

using dnnl::memory;
using Tag = dnnl::memory::format_tag;
using DType = dnnl::memory::data_type;
using Dims = std::vector<int64_t>;

dnnl::engine& Engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

// One convolution shape: its three primitives and the plain layouts Paddle's tensors have.
struct ConvPlan {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_backward_data::primitive_desc bwd_data_pd;
  dnnl::convolution_backward_weights::primitive_desc bwd_weights_pd;
  dnnl::convolution_forward fwd;
  dnnl::convolution_backward_data bwd_data;
  dnnl::convolution_backward_weights bwd_weights;
  memory::desc x_plain, w_plain, y_plain;
};

Dims OutShape(const Dims& x, const Dims& w, const std::vector<int>& strides, const std::vector<int>& pads) {
  return {x[0], w[0], (x[2] + 2 * pads[0] - w[2]) / strides[0] + 1, (x[3] + 2 * pads[1] - w[3]) / strides[1] + 1};
}

// Paddle's weight [O, I/g, kh, kw] is oneDNN's grouped [g, O/g, I/g, kh, kw] (goihw) in the same memory.
Dims WeightDims(const Dims& w, int groups) {
  if (groups == 1) return w;
  return {groups, w[0] / groups, w[1], w[2], w[3]};
}

// A convolution shape as a plan cache's key: input and weight dims, strides, paddings, groups.
std::string ShapeKey(const Dims& x, const Dims& w, const std::vector<int>& strides, const std::vector<int>& pads,
                     int groups) {
  std::string key;
  for (const auto& part : {x, w}) {
    for (auto v : part) key += std::to_string(v) + ",";
  }
  for (const auto& part : {strides, pads}) {
    for (auto v : part) key += std::to_string(v) + ";";
  }
  return key + "g" + std::to_string(groups);
}

// The layouts of Paddle's tensors for a convolution: input, weight (grouped when groups > 1) and output.
std::tuple<memory::desc, memory::desc, memory::desc> PlainLayouts(const Dims& x, const Dims& wd, const Dims& y,
                                                                  int groups) {
  return {memory::desc(x, DType::f32, Tag::nchw), memory::desc(wd, DType::f32, groups == 1 ? Tag::oihw : Tag::goihw),
          memory::desc(y, DType::f32, Tag::nchw)};
}

// Building primitives costs milliseconds; a training run meets a few dozen shapes, so keep them all.
std::shared_ptr<ConvPlan> PlanFor(const Dims& x, const Dims& w, const std::vector<int>& strides,
                                  const std::vector<int>& pads, int groups, bool bias, bool bf16) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<ConvPlan>> plans;
  std::string key = ShapeKey(x, w, strides, pads, groups);
  if (bias) key += "b";
  if (bf16) key += "bf16";
  std::lock_guard<std::mutex> lock(mu);
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;

  const Dims y = OutShape(x, w, strides, pads);
  const Dims wd = WeightDims(w, groups);
  const memory::dims stride{strides[0], strides[1]};
  const memory::dims pad{pads[0], pads[1]};
  // "any": oneDNN picks its blocked layouts; Reordered() below converts at the edges (and, for bf16, the
  // type). With bf16 the sources (x, w, dy) are bf16 and every result (y, dx, dw) float32.
  const DType in = bf16 ? DType::bf16 : DType::f32;
  const auto x_any = memory::desc(x, in, Tag::any);
  const auto w_any = memory::desc(wd, in, Tag::any);
  const auto y_any = memory::desc(y, DType::f32, Tag::any);
  const auto x_out = memory::desc(x, DType::f32, Tag::any);
  const auto w_out = memory::desc(wd, DType::f32, Tag::any);
  const auto b_plain = memory::desc({w[0]}, DType::f32, Tag::x);   // bias and its gradient: float32 in every mode
  const auto dy_any = memory::desc(y, in, Tag::any);
  auto plan = std::make_shared<ConvPlan>();
  const auto algo = dnnl::algorithm::convolution_direct;
  dnnl::primitive_attr attr;   // scratchpads from Workspace too (see there)
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (bias) {
    plan->fwd_pd = dnnl::convolution_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_training, algo, x_any, w_any, b_plain, y_any, stride, pad, pad, attr);
  } else {
    plan->fwd_pd = dnnl::convolution_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_training, algo, x_any, w_any, y_any, stride, pad, pad, attr);
  }
  plan->bwd_data_pd = dnnl::convolution_backward_data::primitive_desc(
      Engine(), algo, x_out, w_any, dy_any, stride, pad, pad, plan->fwd_pd, attr);
  if (bias) {
    plan->bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
        Engine(), algo, x_any, w_out, b_plain, dy_any, stride, pad, pad, plan->fwd_pd, attr);
  } else {
    plan->bwd_weights_pd = dnnl::convolution_backward_weights::primitive_desc(
        Engine(), algo, x_any, w_out, dy_any, stride, pad, pad, plan->fwd_pd, attr);
  }
  plan->fwd = dnnl::convolution_forward(plan->fwd_pd);
  plan->bwd_data = dnnl::convolution_backward_data(plan->bwd_data_pd);
  plan->bwd_weights = dnnl::convolution_backward_weights(plan->bwd_weights_pd);
  std::tie(plan->x_plain, plan->w_plain, plan->y_plain) = PlainLayouts(x, wd, y, groups);
  plans.emplace(key, plan);
  return plan;
}

float* Data(const paddle::Tensor& t) { return const_cast<float*>(t.data<float>()); }

void CheckDense(const paddle::Tensor& t, const char* what, const char* op = "ppmulti_onednn_conv2d") {
  PD_CHECK(t.is_cpu(), op, " runs on CPU only (", what, ")");
  PD_CHECK(t.dtype() == paddle::DataType::FLOAT32, op, " takes float32 (", what, ")");
  auto* dense = dynamic_cast<phi::DenseTensor*>(t.impl().get());
  PD_CHECK(dense != nullptr && dense->meta().is_contiguous(), op, " needs a contiguous dense tensor (", what, ")");
}

// Temporary buffers come from Paddle's caching allocator: fresh mallocs of this size are new pages
// every call, and the page faults cost more than the reorders themselves.
class Workspace {
 public:
  explicit Workspace(const paddle::Place& place) : place_(place) {}

  memory Make(const memory::desc& desc) {
    const int64_t floats = static_cast<int64_t>((desc.get_size() + sizeof(float) - 1) / sizeof(float));
    held_.push_back(paddle::empty({std::max<int64_t>(floats, 1)}, paddle::DataType::FLOAT32, place_));
    return memory(desc, Engine(), held_.back().data<float>());
  }

  // A source tensor in the layout a primitive wants: the tensor's own buffer, or a reordered copy.
  memory Reordered(dnnl::stream& s, const memory::desc& plain, const memory::desc& wanted, float* data) {
    memory user(plain, Engine(), data);
    if (wanted == plain) return user;
    memory copy = Make(wanted);
    dnnl::reorder(user, copy).execute(s, user, copy);
    return copy;
  }

  // Where a primitive writes: the output tensor's buffer, or scratch that WriteBack() converts.
  memory Destination(const memory::desc& plain, const memory::desc& wanted, float* data) {
    if (wanted == plain) return memory(plain, Engine(), data);
    return Make(wanted);
  }

 private:
  paddle::Place place_;
  std::vector<paddle::Tensor> held_;   // alive until the kernel returns (after the stream wait)
};

void WriteBack(dnnl::stream& s, memory& result, const memory::desc& plain, float* data) {
  if (result.get_desc() == plain) return;
  memory user(plain, Engine(), data);
  dnnl::reorder(result, user).execute(s, result, user);
}

// SiLU is elementwise: x, y, dy and dx share one dense row-major layout, so the primitives work on the
// tensors' own buffers with no reorder.
struct SiluPlan {
  dnnl::eltwise_forward::primitive_desc fwd_pd;
  dnnl::eltwise_backward::primitive_desc bwd_pd;
  dnnl::eltwise_forward fwd;
  dnnl::eltwise_backward bwd;
};

int64_t Numel(const Dims& shape) {
  int64_t n = 1;
  for (auto v : shape) n *= v;
  return n;
}

// The tensor's shape with row-major strides; rank 0 (and ranks past oneDNN's limit) as one flat dimension.
memory::desc PlainDesc(const Dims& shape) {
  Dims dims = shape;
  if (dims.empty() || dims.size() > static_cast<size_t>(DNNL_MAX_NDIMS)) dims = {Numel(shape)};
  Dims strides(dims.size(), 1);
  for (int i = static_cast<int>(dims.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * dims[i + 1];
  return memory::desc(dims, DType::f32, strides);
}

std::shared_ptr<SiluPlan> SiluPlanFor(const Dims& shape) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<SiluPlan>> plans;
  std::string key;
  for (auto v : shape) key += std::to_string(v) + ",";
  std::lock_guard<std::mutex> lock(mu);
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;

  const auto desc = PlainDesc(shape);
  const auto algo = dnnl::algorithm::eltwise_swish;   // x * sigmoid(alpha * x); alpha 1 is SiLU
  const float alpha = 1.0f;
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  auto plan = std::make_shared<SiluPlan>();
  plan->fwd_pd = dnnl::eltwise_forward::primitive_desc(Engine(), dnnl::prop_kind::forward_training, algo, desc,
                                                       desc, alpha, 0.0f, attr);
  // "use src": the gradient is computed from x (which Paddle keeps for the backward pass), not from y
  plan->bwd_pd = dnnl::eltwise_backward::primitive_desc(Engine(), algo, desc, desc, desc, alpha, 0.0f,
                                                        plan->fwd_pd, attr);
  plan->fwd = dnnl::eltwise_forward(plan->fwd_pd);
  plan->bwd = dnnl::eltwise_backward(plan->bwd_pd);
  plans.emplace(key, plan);
  return plan;
}

// Inference only: one convolution shape with its bias (the caller folds BatchNorm into weight and bias) and,
// with ``silu``, SiLU applied by the convolution as a oneDNN post-op, so a conv+BN+SiLU layer is one primitive
// and one pass over its output. No backward: evaluation and prediction run without gradients.
struct InferPlan {
  dnnl::convolution_forward::primitive_desc fwd_pd;
  dnnl::convolution_forward fwd;
  memory::desc x_plain, w_plain, y_plain;
};

std::shared_ptr<InferPlan> InferPlanFor(const Dims& x, const Dims& w, const std::vector<int>& strides,
                                        const std::vector<int>& pads, int groups, bool silu) {
  static std::mutex mu;
  static std::unordered_map<std::string, std::shared_ptr<InferPlan>> plans;
  const std::string key = ShapeKey(x, w, strides, pads, groups) + (silu ? "s" : "");
  std::lock_guard<std::mutex> lock(mu);
  auto found = plans.find(key);
  if (found != plans.end()) return found->second;

  const Dims y = OutShape(x, w, strides, pads);
  const Dims wd = WeightDims(w, groups);
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (silu) {
    dnnl::post_ops ops;
    ops.append_eltwise(dnnl::algorithm::eltwise_swish, 1.0f, 0.0f);   // x * sigmoid(1 * x)
    attr.set_post_ops(ops);
  }
  auto plan = std::make_shared<InferPlan>();
  plan->fwd_pd = dnnl::convolution_forward::primitive_desc(
      Engine(), dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
      memory::desc(x, DType::f32, Tag::any), memory::desc(wd, DType::f32, Tag::any),
      memory::desc({w[0]}, DType::f32, Tag::x), memory::desc(y, DType::f32, Tag::any),
      memory::dims{strides[0], strides[1]}, memory::dims{pads[0], pads[1]}, memory::dims{pads[0], pads[1]}, attr);
  plan->fwd = dnnl::convolution_forward(plan->fwd_pd);
  std::tie(plan->x_plain, plan->w_plain, plan->y_plain) = PlainLayouts(x, wd, y, groups);
  plans.emplace(key, plan);
  return plan;
}

// One forward pass through a plan's convolution (ConvPlan's for training, InferPlan's for inference), Paddle's
// plain tensors reordered to the primitive's layouts and back; ``b``: the bias, or nullptr.
template <typename Plan>
paddle::Tensor Convolve(const Plan& plan, const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor* b,
                        const std::vector<int>& strides, const std::vector<int>& paddings) {
  auto y = paddle::empty(OutShape(x.shape(), w.shape(), strides, paddings), x.dtype(), x.place());
  dnnl::stream s(Engine());
  Workspace ws(x.place());
  auto src = ws.Reordered(s, plan.x_plain, plan.fwd_pd.src_desc(), Data(x));
  auto wei = ws.Reordered(s, plan.w_plain, plan.fwd_pd.weights_desc(), Data(w));
  auto dst = ws.Destination(plan.y_plain, plan.fwd_pd.dst_desc(), y.data<float>());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DST, dst},
                                       {DNNL_ARG_SCRATCHPAD, ws.Make(plan.fwd_pd.scratchpad_desc())}};
  if (b != nullptr) args.emplace(DNNL_ARG_BIAS, memory(plan.fwd_pd.bias_desc(), Engine(), Data(*b)));
  plan.fwd.execute(s, args);
  WriteBack(s, dst, plan.y_plain, y.data<float>());
  s.wait();
  return y;
}

}  // namespace

// ``b``: the bias, or nullptr for a convolution without one.
static std::vector<paddle::Tensor> Forward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor* b,
                                           const std::vector<int>& strides, const std::vector<int>& paddings,
                                           int groups, bool bf16) {
  CheckDense(x, "input");
  CheckDense(w, "weight");
  if (b != nullptr) CheckDense(*b, "bias");
  PD_CHECK(groups >= 1 && x.shape()[1] == w.shape()[1] * groups && w.shape()[0] % groups == 0,
           "ppmulti_onednn_conv2d: the input's channels, the weight's and groups disagree");
  return {Convolve(*PlanFor(x.shape(), w.shape(), strides, paddings, groups, b != nullptr, bf16), x, w, b,
                   strides, paddings)};
}

static std::vector<paddle::Tensor> InferForward(const paddle::Tensor& x, const paddle::Tensor& w,
                                                const paddle::Tensor& b, const std::vector<int>& strides,
                                                const std::vector<int>& paddings, int groups, bool silu) {
  const char* op = "ppmulti_onednn_conv2d_infer";
  CheckDense(x, "input", op);
  CheckDense(w, "weight", op);
  CheckDense(b, "bias", op);
  PD_CHECK(groups >= 1 && x.shape()[1] == w.shape()[1] * groups && w.shape()[0] % groups == 0,
           op, ": the input's channels, the weight's and groups disagree");
  PD_CHECK(b.shape() == Dims{w.shape()[0]}, op, ": the bias needs one value per output channel");
  return {Convolve(*InferPlanFor(x.shape(), w.shape(), strides, paddings, groups, silu), x, w, &b, strides,
                   paddings)};
}

// Returns {dx, dw} without a bias, {dx, dw, db} with one.
static std::vector<paddle::Tensor> Backward(const paddle::Tensor& x, const paddle::Tensor& w, const paddle::Tensor& dy,
                                            bool bias, const std::vector<int>& strides,
                                            const std::vector<int>& paddings, int groups, bool bf16) {
  CheckDense(x, "input");
  CheckDense(w, "weight");
  CheckDense(dy, "output gradient");
  auto plan = PlanFor(x.shape(), w.shape(), strides, paddings, groups, bias, bf16);
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  auto dw = paddle::empty(w.shape(), w.dtype(), w.place());
  dnnl::stream s(Engine());
  Workspace ws(x.place());

  auto diff_dst = ws.Reordered(s, plan->y_plain, plan->bwd_data_pd.diff_dst_desc(), Data(dy));
  auto wei = ws.Reordered(s, plan->w_plain, plan->bwd_data_pd.weights_desc(), Data(w));
  auto diff_src = ws.Destination(plan->x_plain, plan->bwd_data_pd.diff_src_desc(), dx.data<float>());
  plan->bwd_data.execute(s, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, diff_src},
                             {DNNL_ARG_SCRATCHPAD, ws.Make(plan->bwd_data_pd.scratchpad_desc())}});
  WriteBack(s, diff_src, plan->x_plain, dx.data<float>());

  auto src = ws.Reordered(s, plan->x_plain, plan->bwd_weights_pd.src_desc(), Data(x));
  if (plan->bwd_weights_pd.diff_dst_desc() != diff_dst.get_desc()) {
    diff_dst = ws.Reordered(s, plan->y_plain, plan->bwd_weights_pd.diff_dst_desc(), Data(dy));
  }
  auto diff_wei = ws.Destination(plan->w_plain, plan->bwd_weights_pd.diff_weights_desc(), dw.data<float>());
  std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst},
                                       {DNNL_ARG_DIFF_WEIGHTS, diff_wei},
                                       {DNNL_ARG_SCRATCHPAD, ws.Make(plan->bwd_weights_pd.scratchpad_desc())}};
  paddle::Tensor db;
  if (bias) {
    db = paddle::empty({w.shape()[0]}, w.dtype(), w.place());
    args.emplace(DNNL_ARG_DIFF_BIAS, memory(plan->bwd_weights_pd.diff_bias_desc(), Engine(), db.data<float>()));
  }
  plan->bwd_weights.execute(s, args);
  WriteBack(s, diff_wei, plan->w_plain, dw.data<float>());
  s.wait();
  if (bias) return {dx, dw, db};
  return {dx, dw};
}

std::vector<paddle::Tensor> OnednnSiluForward(const paddle::Tensor& x) {
  CheckDense(x, "input", "ppmulti_onednn_silu");
  auto y = paddle::empty(x.shape(), x.dtype(), x.place());
  if (Numel(x.shape()) == 0) return {y};   // Paddle rejects it as uninitialised; silu.py keeps these on F.silu
  auto plan = SiluPlanFor(x.shape());
  dnnl::stream s(Engine());
  Workspace ws(x.place());
  const auto desc = plan->fwd_pd.src_desc();
  memory src(desc, Engine(), Data(x));
  memory dst(desc, Engine(), y.data<float>());
  plan->fwd.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DST, dst},
                        {DNNL_ARG_SCRATCHPAD, ws.Make(plan->fwd_pd.scratchpad_desc())}});
  s.wait();
  return {y};
}

std::vector<paddle::Tensor> OnednnSiluBackward(const paddle::Tensor& x, const paddle::Tensor& dy) {
  CheckDense(x, "input", "ppmulti_onednn_silu");
  CheckDense(dy, "output gradient", "ppmulti_onednn_silu");
  PD_CHECK(x.shape() == dy.shape(), "ppmulti_onednn_silu: the output gradient's shape differs from the input's");
  auto dx = paddle::empty(x.shape(), x.dtype(), x.place());
  if (Numel(x.shape()) == 0) return {dx};
  auto plan = SiluPlanFor(x.shape());
  dnnl::stream s(Engine());
  Workspace ws(x.place());
  const auto desc = plan->bwd_pd.src_desc();
  memory src(desc, Engine(), Data(x));
  memory diff_dst(desc, Engine(), Data(dy));
  memory diff_src(desc, Engine(), dx.data<float>());
  plan->bwd.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_SRC, diff_src},
                        {DNNL_ARG_SCRATCHPAD, ws.Make(plan->bwd_pd.scratchpad_desc())}});
  s.wait();
  return {dx};
}

std::vector<Dims> OnednnSiluInferShape(const Dims& x) { return {x}; }

std::vector<paddle::DataType> OnednnSiluInferDtype(const paddle::DataType& x) { return {x}; }

// Whether bf16 convolutions run natively here: [the ISA oneDNN dispatches to has AVX512-BF16 (or AMX),
// the implementation oneDNN picks for a bf16 convolution is not its slow reference one]. Without native
// bf16, oneDNN may emulate it (avx512_core) or fall back to reference code, both slower than float32.
static std::vector<paddle::Tensor> Bf16Support(const paddle::Tensor& x) {
  const auto isa = static_cast<int>(dnnl::get_effective_cpu_isa());
  const auto bf16_isa = static_cast<int>(dnnl::cpu_isa::avx512_core_bf16);
  int native = (isa & bf16_isa) == bf16_isa ? 1 : 0;
  int optimized = 0;
  try {
    const Dims xs{2, 16, 8, 8}, ws{16, 16, 3, 3};
    auto pd = dnnl::convolution_forward::primitive_desc(
        Engine(), dnnl::prop_kind::forward_training, dnnl::algorithm::convolution_direct,
        memory::desc(xs, DType::bf16, Tag::any), memory::desc(ws, DType::bf16, Tag::any),
        memory::desc(xs, DType::f32, Tag::any), {1, 1}, {1, 1}, {1, 1});
    optimized = std::string(pd.impl_info_str()).rfind("ref", 0) == 0 ? 0 : 1;
  } catch (const dnnl::error&) {
    optimized = 0;   // no bf16 convolution at all on this CPU
  }
  auto out = paddle::empty({2}, paddle::DataType::INT32, x.place());
  out.data<int>()[0] = native;
  out.data<int>()[1] = optimized;
  return {out};
}

std::vector<Dims> OnednnConvInferShape(const Dims& x, const Dims& w, const std::vector<int>& strides,
                                       const std::vector<int>& paddings, int) {
  return {OutShape(x, w, strides, paddings)};
}

std::vector<Dims> OnednnConvBiasInferShape(const Dims& x, const Dims& w, const Dims&, const std::vector<int>& strides,
                                           const std::vector<int>& paddings, int) {
  return {OutShape(x, w, strides, paddings)};
}

std::vector<paddle::DataType> OnednnConvInferDtype(const paddle::DataType& x, const paddle::DataType&) {
  return {x};
}

std::vector<paddle::DataType> OnednnConvBiasInferDtype(const paddle::DataType& x, const paddle::DataType&,
                                                       const paddle::DataType&) {
  return {x};
}

// The kernels Paddle calls: without and with a bias, float32 and bf16.
#define PPMULTI_CONV_KERNELS(NAME, BF16)                                                                      \
  std::vector<paddle::Tensor> NAME##Forward(const paddle::Tensor& x, const paddle::Tensor& w,                  \
                                            const std::vector<int>& strides, const std::vector<int>& paddings, \
                                            int groups) {                                                      \
    return Forward(x, w, nullptr, strides, paddings, groups, BF16);                                            \
  }                                                                                                            \
  std::vector<paddle::Tensor> NAME##Backward(const paddle::Tensor& x, const paddle::Tensor& w,                 \
                                             const paddle::Tensor& dy, const std::vector<int>& strides,        \
                                             const std::vector<int>& paddings, int groups) {                   \
    return Backward(x, w, dy, false, strides, paddings, groups, BF16);                                        \
  }                                                                                                            \
  std::vector<paddle::Tensor> NAME##BiasForward(const paddle::Tensor& x, const paddle::Tensor& w,              \
                                                const paddle::Tensor& b, const std::vector<int>& strides,      \
                                                const std::vector<int>& paddings, int groups) {                \
    return Forward(x, w, &b, strides, paddings, groups, BF16);                                                 \
  }                                                                                                            \
  std::vector<paddle::Tensor> NAME##BiasBackward(const paddle::Tensor& x, const paddle::Tensor& w,             \
                                                 const paddle::Tensor&, const paddle::Tensor& dy,              \
                                                 const std::vector<int>& strides,                              \
                                                 const std::vector<int>& paddings, int groups) {               \
    return Backward(x, w, dy, true, strides, paddings, groups, BF16);                                         \
  }

PPMULTI_CONV_KERNELS(OnednnConv, false)
PPMULTI_CONV_KERNELS(OnednnConvBf16, true)

std::vector<Dims> Bf16SupportInferShape(const Dims&) { return {{2}}; }

std::vector<paddle::DataType> Bf16SupportInferDtype(const paddle::DataType&) { return {paddle::DataType::INT32}; }

PD_BUILD_OP(ppmulti_onednn_conv2d)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnConvInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnConvInferDtype));

PD_BUILD_GRAD_OP(ppmulti_onednn_conv2d)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBackward));

PD_BUILD_OP(ppmulti_onednn_conv2d_bias)
    .Inputs({"X", "W", "B"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBiasForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnConvBiasInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnConvBiasInferDtype));

PD_BUILD_GRAD_OP(ppmulti_onednn_conv2d_bias)
    .Inputs({"X", "W", "B", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W"), paddle::Grad("B")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBiasBackward));

PD_BUILD_OP(ppmulti_onednn_conv2d_bf16)
    .Inputs({"X", "W"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBf16Forward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnConvInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnConvInferDtype));

PD_BUILD_GRAD_OP(ppmulti_onednn_conv2d_bf16)
    .Inputs({"X", "W", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBf16Backward));

PD_BUILD_OP(ppmulti_onednn_conv2d_bf16_bias)
    .Inputs({"X", "W", "B"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBf16BiasForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnConvBiasInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnConvBiasInferDtype));

PD_BUILD_GRAD_OP(ppmulti_onednn_conv2d_bf16_bias)
    .Inputs({"X", "W", "B", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X"), paddle::Grad("W"), paddle::Grad("B")})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int"})
    .SetKernelFn(PD_KERNEL(OnednnConvBf16BiasBackward));

std::vector<Dims> OnednnConvInferInferShape(const Dims& x, const Dims& w, const Dims&,
                                            const std::vector<int>& strides, const std::vector<int>& paddings, int,
                                            bool) {
  return {OutShape(x, w, strides, paddings)};
}

// Inference only (no gradient op): conv + bias, SiLU fused with ``silu`` (InferPlan).
PD_BUILD_OP(ppmulti_onednn_conv2d_infer)
    .Inputs({"X", "W", "B"})
    .Outputs({"Out"})
    .Attrs({"strides: std::vector<int>", "paddings: std::vector<int>", "groups: int", "silu: bool"})
    .SetKernelFn(PD_KERNEL(InferForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnConvInferInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnConvBiasInferDtype));

PD_BUILD_OP(ppmulti_onednn_bf16_support)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(Bf16Support))
    .SetInferShapeFn(PD_INFER_SHAPE(Bf16SupportInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(Bf16SupportInferDtype));

PD_BUILD_OP(ppmulti_onednn_silu)
    .Inputs({"X"})
    .Outputs({"Out"})
    .SetKernelFn(PD_KERNEL(OnednnSiluForward))
    .SetInferShapeFn(PD_INFER_SHAPE(OnednnSiluInferShape))
    .SetInferDtypeFn(PD_INFER_DTYPE(OnednnSiluInferDtype));

PD_BUILD_GRAD_OP(ppmulti_onednn_silu)
    .Inputs({"X", paddle::Grad("Out")})
    .Outputs({paddle::Grad("X")})
    .SetKernelFn(PD_KERNEL(OnednnSiluBackward));
