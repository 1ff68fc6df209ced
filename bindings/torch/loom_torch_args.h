/*
 * The loom backend's checks of torch's arguments and their translation
 * to Loom's: dtypes, reduce ops, tensors' device, layout and shape. Each
 * refusal is a TORCH_CHECK with the sentence the user sees. Included by
 * loom_torch.cpp only.
 * SPDX-License-Identifier: Apache-2.0
 */
#ifndef LOOM_TORCH_ARGS_H
#define LOOM_TORCH_ARGS_H

#include <torch/extension.h>

#include <torch/csrc/distributed/c10d/Types.hpp>

#include <string>
#include <vector>

#include "loom.h"
#include "nccl.h"

namespace loom_torch {

namespace {

std::string describe(const at::Tensor &t) {
  std::string s = c10::str(t.scalar_type(), " tensor of shape ", t.sizes(), " on ", t.device());
  return s;
}

ncclDataType_t nccl_type(const at::Tensor &t, const char *what) {
  switch (t.scalar_type()) {
  case at::kChar:
    return ncclInt8;
  case at::kByte:
  case at::kBool:
    return ncclUint8;
  case at::kInt:
    return ncclInt32;
  case at::kLong:
    return ncclInt64;
  case at::kHalf:
    return ncclFloat16;
  case at::kBFloat16:
    return ncclBfloat16;
  case at::kFloat:
    return ncclFloat32;
  case at::kDouble:
    return ncclFloat64;
  default:
    TORCH_CHECK(false, "loom backend: ", what, " is a ", describe(t), ", and Loom has no ", t.scalar_type(),
                " type: use int8, uint8, int32, int64, float16, bfloat16, float32, float64 or bool");
  }
}

const char *op_name(c10d::ReduceOp::RedOpType op) {
  switch (op) {
  case c10d::ReduceOp::SUM:
    return "SUM";
  case c10d::ReduceOp::AVG:
    return "AVG";
  case c10d::ReduceOp::PRODUCT:
    return "PRODUCT";
  case c10d::ReduceOp::MIN:
    return "MIN";
  case c10d::ReduceOp::MAX:
    return "MAX";
  case c10d::ReduceOp::BAND:
    return "BAND";
  case c10d::ReduceOp::BOR:
    return "BOR";
  case c10d::ReduceOp::BXOR:
    return "BXOR";
  case c10d::ReduceOp::PREMUL_SUM:
    return "PREMUL_SUM";
  default:
    return "UNUSED";
  }
}

ncclRedOp_t nccl_op(const c10d::ReduceOp &rop, const at::Tensor &t) {
  auto op = static_cast<c10d::ReduceOp::RedOpType>(rop);
  bool is_bool = t.scalar_type() == at::kBool;
  switch (op) {
  case c10d::ReduceOp::SUM:
    return is_bool ? ncclMax : ncclSum;
  case c10d::ReduceOp::PRODUCT:
    return is_bool ? ncclMin : ncclProd;
  case c10d::ReduceOp::MIN:
    return ncclMin;
  case c10d::ReduceOp::MAX:
    return ncclMax;
  case c10d::ReduceOp::AVG:
    TORCH_CHECK(!is_bool, "loom backend: ReduceOp.AVG has no meaning on bool tensors");
    return ncclAvg;
  case c10d::ReduceOp::BAND:
  case c10d::ReduceOp::BOR:
  case c10d::ReduceOp::BXOR:
    // bool travels as uint8 holding 0 or 1: AND and OR are MIN and MAX
    // there, and XOR of 0s and 1s stays 0 or 1.
    if (is_bool && op != c10d::ReduceOp::BXOR)
      return op == c10d::ReduceOp::BAND ? ncclMin : ncclMax;
    if (at::isIntegralType(t.scalar_type(), /*includeBool=*/true))
      return op == c10d::ReduceOp::BAND ? loomBand : op == c10d::ReduceOp::BOR ? loomBor : loomBxor;
    break;
  default:
    break;
  }
  TORCH_CHECK(false, "loom backend: ReduceOp.", op_name(op), " is not supported on ", t.scalar_type(),
              " (Loom has SUM, PRODUCT, MIN, MAX and AVG, and BAND, BOR and BXOR on integer and bool tensors)");
}

void check_tensor(const at::Tensor &t, const char *what) {
  TORCH_CHECK(t.defined(), "loom backend: ", what, " is an undefined tensor");
  TORCH_CHECK(t.device().is_cpu(), "loom backend: ", what, " is a ", describe(t),
              "; the loom backend takes CPU tensors only (for CUDA tensors use backend=\"nccl\" with Loom's "
              "libnccl.so.2 in its place, docs/pytorch.md)");
  TORCH_CHECK(t.layout() == at::kStrided, "loom backend: ", what, " is a ", t.layout(),
              " tensor; only dense (strided) tensors are supported");
  TORCH_CHECK(t.is_contiguous(), "loom backend: ", what, " (", describe(t), ", strides ", t.strides(),
              ") is not contiguous: call .contiguous() first");
  nccl_type(t, what);
}

void check_single(const std::vector<at::Tensor> &ts, const char *what) {
  TORCH_CHECK(ts.size() == 1, "loom backend: ", what, " takes exactly one tensor per call, not ", ts.size());
  check_tensor(ts[0], what);
}

void check_like(const at::Tensor &t, const at::Tensor &ref, const char *what, const char *refwhat) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "loom backend: ", what, " is ", t.scalar_type(), " but ", refwhat,
              " is ", ref.scalar_type(), ": they must have the same dtype");
  TORCH_CHECK(t.sizes() == ref.sizes(), "loom backend: ", what, " has shape ", t.sizes(), " but ", refwhat,
              " has shape ", ref.sizes(), ": they must have the same shape");
}

void check_same_type(const at::Tensor &t, const at::Tensor &ref, const char *what, const char *refwhat) {
  TORCH_CHECK(t.scalar_type() == ref.scalar_type(), "loom backend: ", what, " is ", t.scalar_type(), " but ", refwhat,
              " is ", ref.scalar_type(), ": they must have the same dtype");
}

} // namespace

} // namespace loom_torch

#endif
