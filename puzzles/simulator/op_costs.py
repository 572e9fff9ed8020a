"""What one aten op costs: its FLOPs and the bytes it reads and writes. The clock (cost.py) turns the two into
ticks with a roofline; the compute checks count the same FLOPs.

Every op a rank runs is counted, so there is no free way to compute. The rules, most specific first:

    views and metadata    0 FLOPs, 0 bytes       view, t, transpose, expand, slice, select, detach, chunk, split,
                                                 empty (allocates, writes nothing), .item(), torch.tensor's wrap
    products              their formulas         mm, addmm, bmm, baddbmm, convolutions, attention: torch's own
                                                 (torch.utils.flop_counter); mv, addmv 2·n·k; dot, vdot 2·n;
                                                 addr 2·n·m; addbmm 2·b·n·k·m; in place (addmm_) as out of place;
                                                 bilinear (_trilinear) 2 per element of the product;
                                                 cdist 3·n·m·d; sparse inputs 2·nnz·k; FFT 5·N·log2(n);
                                                 solve, inverse, LU, QR, SVD, eigen: 2·n³ + 2·n²·k per matrix
    softmax, norms        per element            softmax and log-softmax 5, their backward 4; layer norm 8,
                                                 its backward 16 (RMS norm is written out of elementwise ops)
    moving data           0 FLOPs, its bytes     clone, copy_, cat, stack, index_select, gather, zeros, fill, ...
    elementwise           1 per output element   add, mul, gelu, exp, where, ... (addcmul, addcdiv, lerp: 3)
    reductions            1 per input element    sum, mean, max, argmax, cumsum, ... (norms 2, variance 3)
    accumulating          1 per source element   index_add_, scatter_add_, scatter_reduce_, index_put_ with
                                                 accumulate=True, scatter_ with a reduce; embedding_bag 1 per
                                                 index and column (2 with per_sample_weights)
    scans, sorts          1 per element; n·log2 n  cumsum, cumprod, ...; sort, topk, median, unique, searchsorted
    a constant each       1 per element          losses, activations' backwards, pooling, padding, dropout, ...
    complex operands      4 times the above      a complex product is four real ones (and a sum is two)
    anything else         refused                UncostedOpError, naming the op and the line: no silent charge

An op with no rule here does not run on a rank (allowed.py states the policy): the clock and the FLOP count would
have to guess its work, and a guess is a door. Ops torch composes from others (F.conv1d, einsum, F.linear) reach
the dispatcher as the ops they are made of, which is why so few names are needed.

Bytes are what the op reads and writes: every input tensor once (an expanded or overlapping view counts the
memory it spans, not its elements twice), and every output. An in-place op reads and writes its target.

So a matrix product written as elementwise products and sums costs what the product costs, and more time
(a broadcast multiply writes every partial product to memory before the sum reads it back).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch.utils.flop_counter import flop_registry

from .types import UncostedOpError


# The classes of op a cost is reported by (the clock's breakdown, the calibration table in bench/).
OP_CLASSES = ("matmul", "attention", "softmax/norm", "elementwise", "reduction", "memory", "other")
PRODUCTS = ("matmul", "attention")  # the classes that compute sums of products: what a product floor counts


@dataclass(frozen=True)
class OpCost:
    """One op's work: floating-point operations, bytes read plus bytes written, and its class (OP_CLASSES)."""

    flops: int = 0
    bytes: int = 0
    kind: str = "memory"


FREE = OpCost()
REFUSED = (False, "refused")  # the rule of an op with no formula: it does not run on a rank (UncostedOpError)
# The rule of an op torch composes from others (matmul, linear) that reached the dispatcher whole (under
# torch.inference_mode(), which skips the decomposition): the mode runs its decomposition, each op charged.
DECOMPOSE = (False, "decompose")

_aten = torch.ops.aten
# (module constants: on every op, `torch.strided` is two lookups and `(list, tuple)` a tuple built anew)
_TENSOR, _STRIDED, _DTYPE, _SEQUENCES = torch.Tensor, torch.strided, torch.dtype, (list, tuple)


def _packets(*names: str) -> frozenset:
    """The overload packets of the aten ops named (those that this torch has)."""
    return frozenset(p for p in (getattr(_aten, n, None) for n in names) if p is not None)


# Ops that launch no kernel: they make a tensor header, or read a number the host already has.
_NO_KERNEL = _packets("empty", "empty_like", "empty_strided", "new_empty", "new_empty_strided", "_local_scalar_dense",
                      "lift", "lift_fresh", "lift_fresh_copy", "set_", "resize_", "resize_as_", "_reshape_alias",
                      "_unsafe_view", "is_same_size", "_has_compatible_shallow_copy_type", "_linalg_check_errors",
                      "sym_size", "sym_stride", "sym_numel", "sym_storage_offset", "_nested_tensor_size",
                      "record_stream", "_assert_async", "_functional_assert_async",
                      # metadata: a number or a header, no data read
                      "dim", "numel", "size", "stride", "storage_offset", "is_contiguous", "is_complex",
                      "is_coalesced", "is_pinned", "is_non_overlapping_and_dense", "is_strides_like_format",
                      "dense_dim", "sparse_dim", "item", "_assert_scalar", "_assert_tensor_metadata", "is_set_to",
                      "is_conj", "is_neg", "_is_zerotensor", "is_same_size",
                      "sym_constrain_range", "sym_constrain_range_for_size", "_functional_sym_constrain_range",
                      "_functional_sym_constrain_range_for_size", "_make_dep_token", "split", "unsafe_split",
                      "unsafe_split_with_sizes", "unsafe_chunk", "broadcast_tensors", "meshgrid", "t_",
                      "transpose_", "unsqueeze_", "squeeze_", "as_strided_", "slice", "resize", "resize_as",
                      "_resize_output", "_resize_output_")

# Ops that move or fill memory and compute nothing.
_MOVES = _packets("clone", "copy_", "copy", "_to_copy", "_copy_from", "_copy_from_and_resize", "contiguous", "cat",
                  "stack", "hstack", "vstack", "index_select", "index", "_unsafe_index", "gather", "take",
                  "masked_select", "nonzero", "nonzero_static", "zeros", "zeros_like", "ones", "ones_like", "full",
                  "full_like", "new_zeros", "new_ones", "new_full", "scalar_tensor", "fill", "fill_", "zero_",
                  "arange", "repeat", "repeat_interleave", "expand_copy", "permute_copy", "view_copy", "t_copy",
                  "transpose_copy", "slice_copy", "select_copy", "constant_pad_nd", "flip", "roll", "tril", "triu",
                  "tril_", "triu_", "slice_scatter", "select_scatter", "diagonal_scatter", "as_strided_scatter",
                  "scatter", "scatter_", "index_put", "index_put_", "_index_put_impl_", "index_fill", "index_fill_",
                  "embedding", "detach_copy", "alias_copy", "split_with_sizes_copy", "unbind_copy", "narrow_copy",
                  "unfold_copy", "_pin_memory", "resolve_conj", "resolve_neg", "slice_backward", "select_backward",
                  "diagonal_backward", "unfold_backward", "as_strided_copy", "_reshape_copy", "masked_scatter",
                  "block_diag", "_unsafe_index_put", "pad", "reflection_pad1d", "replication_pad1d", "one_hot",
                  "new_empty_strided", "empty_permuted", "squeeze_copy", "unsqueeze_copy", "diagonal_copy",
                  "diag", "diag_embed", "eye", "linspace", "logspace", "tril_indices", "triu_indices", "rot90",
                  "channel_shuffle", "pixel_shuffle", "pixel_unshuffle", "reflection_pad2d", "reflection_pad3d",
                  "replication_pad2d", "replication_pad3d", "im2col", "_chunk_cat", "pad_sequence", "_to_dense",
                  "complex", "_list_to_tensor", "nonzero_numpy", "zero", "masked_scatter_", "_unsafe_masked_index",
                  "upsample_nearest1d", "upsample_nearest2d", "upsample_nearest3d", "_upsample_nearest_exact1d",
                  "_upsample_nearest_exact2d", "_upsample_nearest_exact3d", "max_unpool2d", "max_unpool3d",
                  "_pack_padded_sequence", "_print",
                  # layouts and kinds of tensor (the ledger charges or refuses each: guards.storages_of)
                  "_to_sparse", "_to_sparse_csr", "_to_sparse_csc", "_to_sparse_bsr", "_to_sparse_bsc", "to_sparse",
                  "to_sparse_csr", "to_sparse_csc", "to_sparse_bsr", "to_sparse_bsc", "to_dense", "_to_dense",
                  "sparse_coo_tensor", "_sparse_coo_tensor_unsafe", "_sparse_coo_tensor_with_dims_and_tensors",
                  "sparse_compressed_tensor", "_sparse_compressed_tensor_unsafe", "_sparse_csr_tensor_unsafe",
                  "coalesce", "_coalesce", "_coalesced_", "to_mkldnn", "_to_mkldnn", "mkldnn_reorder_conv2d_weight",
                  "quantize_per_tensor", "quantize_per_channel", "dequantize", "int_repr",
                  "_make_per_tensor_quantized_tensor", "_make_per_channel_quantized_tensor",
                  "_nested_tensor_from_tensor_list", "_nested_from_padded", "_nested_view_from_buffer",
                  "_nested_view_from_buffer_copy", "_nested_tensor_from_mask", "to_padded_tensor",
                  "_nested_from_padded_and_nested_example", "_nested_view_from_jagged", "_nested_get_values",
                  "_sparse_semi_structured_tile")

# Writes that move data unless told to sum it: accumulate=True, a reduce (then 1 FLOP per source element)
_PUTS = _packets("index_put", "index_put_", "_index_put_impl_", "_unsafe_index_put")
_SCATTERS = _packets("scatter", "scatter_")
COPY_OP_NAMES = frozenset(p.__name__ for p in _MOVES)
# Ops that make a tensor like another one: they read its shape, not its data.
_LIKE = _packets("zeros_like", "ones_like", "full_like", "rand_like", "randn_like", "randint_like", "new_zeros",
                 "new_ones", "new_full", "scalar_tensor")  # what a clock event's op names say when it only moved data

# Products without a formula in torch's FLOP counter (the ones it has: mm, addmm, bmm, baddbmm, convolutions,
# attention kernels on GPU). Each of these computes a sum of products, and is charged 2 FLOPs per term.
_VECTOR_PRODUCTS = _packets("mv", "addmv", "dot", "vdot", "inner", "addr", "ger", "outer")
_BATCH_SUMMED_PRODUCTS = _packets("addbmm")  # self + sum over the batch of batch1 @ batch2: 2·b·n·k·m
# Products with a sparse operand: 2 FLOPs per stored value and dense column (cost_parts' sparse rule)
_SPARSE_PRODUCTS = _packets("_sparse_addmm", "_sparse_mm", "sspaddmm", "_sparse_sparse_matmul", "hspmm", "smm",
                            "_sparse_mm_reduce_impl", "_sparse_csr_mm", "_sparse_csr_addmm", "sparse_sampled_addmm")
_SOFTMAX = _packets("_softmax", "_log_softmax", "softmax", "log_softmax", "_safe_softmax")
_SOFTMAX_BACKWARD = _packets("_softmax_backward_data", "_log_softmax_backward_data")
_LAYER_NORM = _packets("native_layer_norm", "native_group_norm", "native_batch_norm", "_native_batch_norm_legit",
                       "_native_batch_norm_legit_no_training", "_fused_rms_norm", "layer_norm", "group_norm")
_LAYER_NORM_BACKWARD = _packets("native_layer_norm_backward", "native_group_norm_backward",
                                "native_batch_norm_backward", "_fused_rms_norm_backward")
_FFT = _packets("_fft_r2c", "_fft_c2r", "_fft_c2c")
_CUBIC = _packets("_linalg_solve_ex", "linalg_solve_ex", "linalg_solve", "linalg_inv_ex", "linalg_inv", "inverse",
                  "linalg_lu_factor_ex", "linalg_lu", "linalg_lu_solve", "lu_solve", "linalg_cholesky_ex",
                  "cholesky", "cholesky_solve", "cholesky_inverse", "triangular_solve", "linalg_solve_triangular",
                  "linalg_qr", "geqrf", "orgqr", "ormqr", "_linalg_svd", "linalg_svd", "svd", "_linalg_eigh",
                  "linalg_eigh", "linalg_eig", "_linalg_eigvals", "linalg_eigvals", "_linalg_det", "linalg_det",
                  "det", "_linalg_slogdet", "linalg_slogdet", "logdet", "linalg_pinv", "linalg_matrix_exp",
                  "matrix_exp", "linalg_householder_product", "linalg_ldl_factor_ex", "linalg_ldl_solve",
                  "_linalg_inv_out_helper", "lu_unpack", "linalg_lstsq", "cholesky_solve")
_CDIST = _packets("_cdist_forward", "_cdist_backward", "_euclidean_dist", "cdist")
_TRILINEAR = _packets("_trilinear")
# Reductions that take more than one FLOP per input element.
_TWO_PER_ELEMENT = _packets("norm", "linalg_vector_norm", "frobenius_norm", "nuclear_norm", "dist", "_weight_norm")
_THREE_PER_ELEMENT = _packets("var", "std", "var_mean", "std_mean", "logsumexp", "addcmul", "addcmul_", "addcdiv",
                              "addcdiv_", "lerp", "lerp_", "_foreach_addcmul", "_foreach_addcmul_",
                              "_foreach_addcdiv", "_foreach_addcdiv_", "_foreach_lerp", "_foreach_lerp_")
# Ops that add many source elements into a target: one FLOP per source element.
_ACCUMULATE = _packets("index_add", "index_add_", "scatter_add", "scatter_add_", "scatter_reduce", "scatter_reduce_",
                       "index_reduce", "index_reduce_", "put", "put_", "segment_reduce", "_segment_reduce_backward",
                       "bincount", "histc", "index_copy", "index_copy_", "col2im",
                       "_unsafe_masked_index_put_accumulate")
# Bags of embedding rows summed (and weighted): per index, each of its row's columns (a multiply-add with weights).
_EMBEDDING_BAGS = _packets("_embedding_bag", "_embedding_bag_forward_only", "embedding_bag", "_embedding_bag_backward",
                           "_embedding_bag_dense_backward", "_embedding_bag_sparse_backward",
                           "_embedding_bag_per_sample_weights_backward")
_EMBEDDING_BACKWARD = _packets("embedding_dense_backward", "embedding_backward")  # every gradient row added once
# Products that torch's counter knows under another name: (packet, the packet whose formula it shares).
_SAME_FORMULA = {p: f for p, f in ((getattr(_aten, a, None), getattr(_aten, b, None)) for a, b in (
    ("_addmm_activation", "addmm"), ("_int_mm", "mm"))) if p is not None and f is not None}
# Convolutions with kernels of their own, charged by torch's convolution formula: (transposed?)
_CONVOLUTIONS = {p: t for names, t in ((("slow_conv_dilated2d", "slow_conv_dilated3d", "slow_conv3d",
                                         "slow_conv3d_forward", "thnn_conv2d", "_conv_depthwise2d",
                                         "mkldnn_convolution"), False),
                                       (("slow_conv_transpose2d", "slow_conv_transpose3d"), True))
                 for p in _packets(*names)}
_CONV_TBC = _packets("conv_tbc")
# Scans: one FLOP per element (a running sum, product, max or log-sum-exp)
_SCANS = _packets("cumsum", "cumsum_", "cumprod", "cumprod_", "cummax", "cummin", "_cummax_helper", "_cummin_helper",
                  "logcumsumexp", "count_nonzero", "all", "any", "prod", "trace")
# Sorting and searching: n·log2(n) comparisons for n elements
_SORTS = _packets("sort", "argsort", "msort", "topk", "kthvalue", "median", "nanmedian", "mode", "_unique",
                  "_unique2", "unique_dim", "unique_consecutive", "searchsorted", "bucketize", "isin")
# Kernels of a few operations per element that torch does not tag pointwise: losses, activations' backwards,
# pooling, upsampling, dropout, norms' variants. One FLOP per element read or written, as before the allowlist.
_PER_ELEMENT = _packets(
    "allclose", "where", "masked_fill", "masked_fill_", "floor_divide", "floor_divide_", "remainder", "fmod", "rsub",
    "true_divide", "true_divide_", "divide", "divide_", "threshold", "threshold_", "threshold_backward",
    "leaky_relu_backward", "hardtanh_backward", "gelu_backward", "elu_backward", "softplus_backward",
    "hardswish_backward", "hardsigmoid_backward", "mish_backward", "log_sigmoid_forward", "log_sigmoid_backward",
    "glu", "glu_backward", "_prelu_kernel", "_prelu_kernel_backward", "prelu", "_add_relu", "_masked_scale",
    "_fused_dropout", "native_dropout_backward", "dropout", "alpha_dropout", "rrelu_with_noise",
    "rrelu_with_noise_", "rrelu_with_noise_backward", "rrelu_with_noise_functional", "binary_cross_entropy",
    "binary_cross_entropy_backward", "binary_cross_entropy_with_logits", "mse_loss", "mse_loss_backward",
    "nll_loss", "nll_loss_forward", "nll_loss_backward", "nll_loss2d_forward", "nll_loss2d_backward",
    "smooth_l1_loss", "smooth_l1_loss_backward", "huber_loss", "huber_loss_backward", "soft_margin_loss",
    "soft_margin_loss_backward", "multi_margin_loss", "multilabel_margin_loss_forward", "hinge_embedding_loss",
    "margin_ranking_loss", "renorm", "renorm_", "avg_pool2d", "avg_pool2d_backward", "avg_pool3d",
    "avg_pool3d_backward", "_adaptive_avg_pool2d", "_adaptive_avg_pool2d_backward", "_adaptive_avg_pool3d",
    "_adaptive_avg_pool3d_backward", "adaptive_max_pool2d", "adaptive_max_pool2d_backward", "adaptive_max_pool3d",
    "adaptive_max_pool3d_backward", "max_pool2d_with_indices", "max_pool2d_with_indices_backward",
    "max_pool3d_with_indices", "max_pool3d_with_indices_backward", "fractional_max_pool2d",
    "reflection_pad1d_backward", "reflection_pad2d_backward", "reflection_pad3d_backward",
    "replication_pad1d_backward", "replication_pad2d_backward", "replication_pad3d_backward",
    "upsample_nearest2d_backward", "_upsample_nearest_exact2d_backward", "upsample_bilinear2d",
    "upsample_linear1d", "upsample_bicubic2d", "upsample_trilinear3d", "_upsample_bilinear2d_aa",
    "_upsample_bilinear2d_aa_backward", "_upsample_bicubic2d_aa", "grid_sampler_2d", "grid_sampler_2d_backward",
    "grid_sampler_3d", "grid_sampler_3d_backward", "pairwise_distance", "linalg_cross", "polar", "frexp",
    "_amp_foreach_non_finite_check_and_unscale_", "masked_scatter_backward", "hann_window", "isfinite", "isinf",
    "isnan", "heaviside_", "xlogy_", "copysign", "copysign_", "gcd_", "lcm_", "ldexp", "angle", "fix", "fix_",
    "_weight_norm_interface", "_weight_norm_interface_backward", "affine_grid_generator")
# Norms' kernels under other names: as native_batch_norm and its backward
_NORM_VARIANTS = _packets("_batch_norm_no_update", "_batch_norm_with_update", "_batch_norm_with_update_functional",
                          "_native_batch_norm_legit_functional", "cudnn_batch_norm", "miopen_batch_norm")
_NORM_VARIANTS_BACKWARD = _packets("batch_norm_backward", "cudnn_batch_norm_backward", "miopen_batch_norm_backward")
# Random numbers: one FLOP per number drawn (a generator step), as an elementwise op.
_RANDOM = _packets("randn", "rand", "randint", "randperm", "normal", "normal_", "uniform_", "bernoulli",
                   "bernoulli_", "exponential_", "geometric_", "log_normal_", "cauchy_", "random_", "multinomial",
                   "native_dropout", "rand_like", "randn_like", "randint_like", "uniform", "exponential",
                   "geometric", "log_normal", "cauchy", "_standard_gamma", "poisson", "_philox_normal_",
                   "_philox_uniform_")
_FOREACH_NORM = _packets("_foreach_norm")
# autograd's anomaly mode (torch.autograd.set_detect_anomaly) asks of each backward op's output whether any entry is
# nan: a reduction of the isnan mask, one FLOP per entry.
_ANOMALY_CHECKS = _packets("_is_any_true", "_is_all_true")
# The fused optimizer kernels, per parameter element (Adam: about 15 elementwise ops; SGD with momentum: 4).
_FUSED_OPTIMIZERS = {p: n for names, n in ((("_fused_adam", "_fused_adam_", "_fused_adamw", "_fused_adamw_"), 15),
                                           (("_fused_sgd", "_fused_sgd_"), 4), (("_fused_adagrad", "_fused_adagrad_"), 6))
                     for p in _packets(*names)}

_POINTWISE = getattr(torch.Tag, "pointwise", None)
_REDUCTION = getattr(torch.Tag, "reduction", None)
# torch before the reduction tag (2.2, the oldest supported) charges the ops a later torch tags so, by name
_REDUCTION_PACKETS = frozenset() if _REDUCTION is not None else frozenset(
    getattr(_aten, name) for name in ("all", "amax", "amin", "aminmax", "any", "argmax", "argmin", "count_nonzero",
                                      "linalg_vector_norm", "logsumexp", "max", "mean", "min", "nansum", "norm",
                                      "prod", "std", "std_mean", "sum", "var", "var_mean") if hasattr(_aten, name))

SOFTMAX_FLOPS, SOFTMAX_BACKWARD_FLOPS = 5, 4  # per element: max, subtract, exp, sum, divide / (g - sum(g·y))·y
NORM_FLOPS, NORM_BACKWARD_FLOPS = 8, 16  # per element: mean, centre, square, sum, rsqrt, scale, affine (2)
COMPLEX_FACTOR = 4  # real operations per complex one (a product: 4 multiplies, 2 adds; charged as 4 FLOPs)
FFT_FLOPS = 5  # 5·N·log2(n): the radix-2 count for N points transformed along axes of length n


def _tensors(value) -> list[torch.Tensor]:
    if isinstance(value, _TENSOR):
        return [value]
    return _tensors_among(value) if isinstance(value, _SEQUENCES) else []


def _tensors_among(values) -> list[torch.Tensor]:
    """_tensors of a list or tuple (an op's args): asking whether a tuple is a Tensor is slow (torch.Tensor's
    metaclass makes isinstance take Python's long way)."""
    found = []
    for v in values:
        if isinstance(v, _TENSOR):
            found.append(v)
        elif isinstance(v, _SEQUENCES):
            found.extend(_tensors(v))
    return found


def _is_sparse(t: torch.Tensor) -> bool:
    return t.layout is not torch.strided  # (`is`: comparing layouts with == costs three times as much)


def _numel(t: torch.Tensor) -> int:
    """Elements an op touches in `t`: its stored values for a sparse tensor, else its elements."""
    if t.layout is torch.strided:
        return t.numel()
    if t.layout is torch.sparse_coo:
        return t._nnz()
    if _is_sparse(t):
        return t.values().numel()
    return t.numel()


def tensor_bytes(t: torch.Tensor) -> int:
    """Bytes an op reads in `t`: the memory its elements span (an expanded view reads its base once), at most
    its elements' size; a sparse tensor's stored values and indices."""
    if t.layout is torch.strided and t.is_contiguous():  # the common case, without walking the strides
        return t.numel() * t.element_size()
    if _is_sparse(t):
        parts = ((t._values(), t._indices()) if t.layout == torch.sparse_coo else
                 (t.values(), t.crow_indices() if t.layout in (torch.sparse_csr, torch.sparse_bsr) else t.ccol_indices(),
                  t.col_indices() if t.layout in (torch.sparse_csr, torch.sparse_bsr) else t.row_indices()))
        return sum(tensor_bytes(p) for p in parts)
    return _span_bytes(t)


def _span_bytes(t: torch.Tensor) -> int:
    """tensor_bytes of a strided tensor that is not contiguous (a transpose, an expanded view)."""
    n = t.numel()
    if n == 0:
        return 0
    try:
        span = 1
        for size, stride in zip(t.shape, t.stride()):
            span += (size - 1) * abs(stride)
    except RuntimeError:  # a tensor without strides
        span = n
    return min(n, span) * t.element_size()


def op_cost(func, args, kwargs, out) -> OpCost:
    """FLOPs and bytes of one aten op (`func`, an OpOverload) called on args/kwargs that returned `out`."""
    return cost_by_rule(rule_for(func), func, args, kwargs, out)


def rule_for(func):
    """How `func` is charged: FREE, or its rule (rule_of), found once per op and kept in _RULES."""
    rule = _RULES.get(func)
    if rule is None:
        rule = _RULES[func] = rule_of(func)
    return rule


def cost_by_rule(rule, func, args, kwargs, out) -> OpCost:
    """op_cost, for a caller that holds `func`'s rule already (rule_for(func))."""
    return FREE if rule is FREE else OpCost(*cost_parts(rule, func, args, kwargs, out))


def cost_parts(rule, func, args, kwargs, out) -> tuple[int, int, str]:
    """(FLOPs, bytes, class) of one op that is not FREE under `rule`: what its OpCost holds. (A caller that meets
    the same figures again and again can keep their OpCost: making one costs more than finding them.)"""
    if rule is REFUSED or rule is DECOMPOSE:  # (a mode decomposes the latter before it gets here)
        _refuse(func)
    inputs = _tensors_among(args) if type(args) is tuple else _tensors(args)
    if kwargs:
        inputs += _tensors_among(list(kwargs.values()))
    outputs = _tensors(out)
    nbytes, read, dense, cplx = 0, not rule[0], True, False  # (an op that makes a tensor like another reads its
    for t in inputs:                                             # shape only)
        if t.is_complex():
            cplx = True
        if t.layout is _STRIDED:
            if read:
                nbytes += t.nbytes if t.is_contiguous() else _span_bytes(t)  # (nbytes: numel·element size)
        else:
            dense = False
            if read:
                nbytes += tensor_bytes(t)
    out_elements = 0  # (_numel of each output, found with its bytes)
    for t in outputs:
        if t.is_complex():
            cplx = True
        if t.layout is _STRIDED:
            n = t.numel()
            out_elements += n
            nbytes += n * t.element_size() if t.is_contiguous() else _span_bytes(t)
        else:
            out_elements += _numel(t)
            nbytes += tensor_bytes(t)
    if not dense and len(inputs) >= 2:
        return _sparse_product(inputs, outputs), nbytes, "matmul"
    flops, kind = _APPLY[rule[1]](rule, func, args, kwargs, out, inputs, out_elements)
    if cplx:  # a complex product is four real products (and two sums); a complex sum two real sums: 4 bounds both
        flops *= COMPLEX_FACTOR
    return flops, nbytes, kind


# func -> FREE, or its rule: (reads no data, the rule's name, its parameters), found once per op so that the
# per-call work is the rule alone (a dozen set lookups on an op's packet, each hashed in Python, were half of an
# op's cost). Plain data (a product's rule holds torch's formula for it, looked up once), so that the grader can
# check that every entry is the rule rule_of gives (tamper.py).
_RULES: dict = {}


def _in_largest(inputs) -> int:
    largest = 0
    for t in inputs:
        n = t.numel() if t.layout is _STRIDED else _numel(t)
        if n > largest:
            largest = n
    return largest


# rule name -> (FLOPs, class) of one op, from (rule, func, args, kwargs, out, its input tensors, its output elements)
_APPLY = {
    "none": lambda rule, func, args, kwargs, out, inputs, out_elements: (0, rule[2]),
    "per input": lambda rule, func, args, kwargs, out, inputs, out_elements: (rule[2] * _in_largest(inputs), rule[3]),
    "per output": lambda rule, func, args, kwargs, out, inputs, out_elements: (rule[2] * out_elements, rule[3]),
    "per element": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        rule[2] * max(_in_largest(inputs), out_elements), rule[3]),
    "registered": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _registered(rule[3], args, kwargs, out), rule[2]),
    "batch summed product": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        2 * args[1].numel() * args[2].shape[-1], "matmul"),  # addbmm: 2·b·n·k·m
    "vector product": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _vector_product(inputs, out_elements), "matmul"),
    "attention": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _attention(inputs[0], inputs[1], backward=False), "attention"),
    "attention backward": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _attention(inputs[1], inputs[2], backward=True), "attention"),
    "fft": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _fft(inputs[0], args[1] if len(args) > 1 else None), "matmul"),
    "cubic": lambda rule, func, args, kwargs, out, inputs, out_elements: (_cubic(inputs), "matmul"),
    "cdist": lambda rule, func, args, kwargs, out, inputs, out_elements: (_cdist(inputs), "matmul"),
    "trilinear": lambda rule, func, args, kwargs, out, inputs, out_elements: (_trilinear(args), "matmul"),
    "accumulate": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        max((_numel(t) for t in inputs[1:]), default=0) or _in_largest(inputs), "reduction"),
    "fused optimizer": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        rule[2] * sum(t.numel() for t in _tensors(args[0])), "elementwise"),
    "random": lambda rule, func, args, kwargs, out, inputs, out_elements: (max(out_elements, 1), "elementwise"),
    "put": lambda rule, func, args, kwargs, out, inputs, out_elements: _put(args, kwargs),
    "scatter reduce": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _numel(args[2]) if isinstance(args[2], _TENSOR) else out_elements, "reduction"),
    "embedding bag": lambda rule, func, args, kwargs, out, inputs, out_elements: (_embedding_bag(inputs), "reduction"),
    "embedding backward": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _numel(inputs[0]), "reduction"),
    "convolution": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        _convolution(args, out, rule[2]), "matmul"),
    "conv tbc": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        2 * out_elements * args[1].shape[0] * args[1].shape[1], "matmul"),
    "sort": lambda rule, func, args, kwargs, out, inputs, out_elements: (_sort(inputs), "reduction"),
    "foreach norm": lambda rule, func, args, kwargs, out, inputs, out_elements: (
        2 * sum(t.numel() for t in _tensors(args[0])), "reduction"),
    "refused": lambda rule, func, args, kwargs, out, inputs, out_elements: _refuse(func),
}


def _refuse(func):
    raise UncostedOpError(refusal(func))


_ADVICE = (("conv", "write the convolution with torch.nn.functional.conv1d or conv2d (charged by torch's "
                    "convolution formula), or as a product (@)"),
           ("mm", "use @ (torch.mm, torch.bmm, torch.nn.functional.linear) in float64"),
           ("rnn", "write the recurrence out of products (@) and elementwise ops"),
           ("lstm", "write the recurrence out of products (@) and elementwise ops"),
           ("gru", "write the recurrence out of products (@) and elementwise ops"),
           ("int4", "keep tensors float64: the puzzles compute in float64"),
           ("int8", "keep tensors float64: the puzzles compute in float64"),
           ("quantize", "keep tensors float64: the puzzles compute in float64"))


def refusal(func) -> str:
    """Why `func` does not run on a rank, and what to write instead: one sentence for the learner."""
    packet = getattr(func, "overloadpacket", None)
    name = str(packet) if isinstance(packet, torch._ops.OpOverloadPacket) else getattr(packet, "__name__", str(func))
    short = name.rsplit(".", 1)[-1]
    advice = next((a for key, a in _ADVICE if key in short), "write it with ops that have one: products (@, "
                  "torch.mm, F.linear, F.conv1d), elementwise ops, reductions, softmax and norms")
    return (f"{name} has no cost formula in the puzzles (puzzles/simulator/op_costs.py), so the clock and the "
            f"FLOP count cannot charge it honestly, and an op they cannot charge does not run on a rank: {advice}")


def _put(args, kwargs):
    """index_put_ (and its kin): a move, unless accumulate=True makes it a sum of every value into its place."""
    accumulate = args[3] if len(args) > 3 else kwargs.get("accumulate", False)
    if not accumulate:
        return 0, "memory"
    values = args[2]
    n = _numel(values) if isinstance(values, _TENSOR) else 1
    indices = [t for t in (args[1] or ()) if isinstance(t, _TENSOR)]
    return max(n, max((t.numel() for t in indices), default=1)), "reduction"


def _embedding_bag(inputs) -> int:
    """Bags of embedding rows (and their backward): each index adds its row's columns (a multiply-add when the
    rows are weighted: per_sample_weights, a floating input besides the table or the gradient)."""
    table = inputs[0]
    index = next((t for t in inputs[1:] if not t.is_floating_point()), None)
    weighted = any(t.is_floating_point() for t in inputs[1:])
    n = index.numel() if index is not None else table.numel()
    return (2 if weighted else 1) * n * (table.shape[-1] if table.dim() else 1)


def _convolution(args, out, transposed: bool) -> int:
    from torch.utils.flop_counter import conv_flop_count

    result = out[0] if isinstance(out, _SEQUENCES) else out
    return int(conv_flop_count(args[0].shape, args[1].shape, result.shape, transposed))


def _sort(inputs) -> int:
    """Sorting or searching n elements: n·log2(n) comparisons (n the largest input's elements)."""
    n = max(_in_largest(inputs), 1)
    return n * max(1, math.ceil(math.log2(max(n, 2))))


def _product_of(packet):
    """The out-of-place op of an in-place one (aten.addmm_ -> aten.addmm): the same product, written into its first
    argument, with the same arguments, so the same formula. Other packets are returned as they are."""
    name = packet.__name__
    return getattr(_aten, name[:-1], packet) if name.endswith("_") and not name.startswith("_") else packet


def _formula(packet):
    """torch's FLOP formula for `packet`, or for its out-of-place op (addmm for addmm_)."""
    formula = flop_registry.get(packet)  # (one lookup: a packet's hash is computed in Python)
    return formula if formula is not None else flop_registry[_product_of(packet)]


def _tags(func, packet) -> set:
    """The tags of any overload of `func`'s packet: torch tags `mul.Tensor` pointwise but not `mul.Scalar_out`.
    (Found once per op: rule_for keeps the rule.)"""
    found = set(func.tags)
    for name in getattr(packet, "overloads", lambda: ())():
        try:
            found.update(getattr(packet, name).tags)
        except (AttributeError, RuntimeError):
            pass
    return found


def rule_of(func):
    """How op_cost charges `func`: FREE, REFUSED (no formula: it does not run on a rank), or (reads no data, the
    rule's name in _APPLY, its parameters)."""
    packet = getattr(func, "overloadpacket", None)
    if packet is None:  # (not an aten operator: a custom op, a higher-order operator)
        return REFUSED
    if func.is_view or packet in _NO_KERNEL:
        return FREE
    like = packet in _LIKE
    if packet in _PUTS:
        return like, "put"
    if packet in _SCATTERS and func._overloadname in ("reduce", "value_reduce"):
        return like, "scatter reduce"
    if packet in _MOVES:
        return like, "none", "memory"
    product = _product_of(packet)  # w.grad.addmm_(h.t(), dy) is the product h.t() @ dy, written in place
    if product in flop_registry:
        return like, "registered", "attention" if "attention" in packet.__name__ else "matmul", _formula(packet)
    if packet in _SAME_FORMULA:
        return like, "registered", "matmul", flop_registry[_SAME_FORMULA[packet]]
    if packet in _CONVOLUTIONS:
        return like, "convolution", _CONVOLUTIONS[packet]
    if packet in _CONV_TBC:
        return like, "conv tbc"
    if product in _VECTOR_PRODUCTS or packet in _SPARSE_PRODUCTS:
        return like, "vector product"
    if product in _BATCH_SUMMED_PRODUCTS:
        return like, "batch summed product"
    if packet is getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu", None):
        return like, "attention"
    if packet is getattr(_aten, "_scaled_dot_product_flash_attention_for_cpu_backward", None):
        return like, "attention backward"
    for group, n, kind in ((_SOFTMAX, SOFTMAX_FLOPS, "softmax/norm"),
                           (_SOFTMAX_BACKWARD, SOFTMAX_BACKWARD_FLOPS, "softmax/norm"),
                           (_LAYER_NORM, NORM_FLOPS, "softmax/norm"), (_NORM_VARIANTS, NORM_FLOPS, "softmax/norm"),
                           (_LAYER_NORM_BACKWARD, NORM_BACKWARD_FLOPS, "softmax/norm"),
                           (_NORM_VARIANTS_BACKWARD, NORM_BACKWARD_FLOPS, "softmax/norm"),
                           (_TWO_PER_ELEMENT, 2, "reduction"), (_SCANS, 1, "reduction"),
                           (_ANOMALY_CHECKS, 1, "reduction")):
        if packet in group:
            return like, "per input", n, kind
    for group, name in ((_FFT, "fft"), (_CUBIC, "cubic"), (_CDIST, "cdist"), (_TRILINEAR, "trilinear"),
                        (_EMBEDDING_BAGS, "embedding bag"), (_EMBEDDING_BACKWARD, "embedding backward"),
                        (_ACCUMULATE, "accumulate"), (_RANDOM, "random"), (_SORTS, "sort"),
                        (_FOREACH_NORM, "foreach norm")):
        if packet in group:
            return like, name
    if packet in _FUSED_OPTIMIZERS:
        return like, "fused optimizer", _FUSED_OPTIMIZERS[packet]
    if packet in _THREE_PER_ELEMENT:
        return like, "per element", 3, "elementwise"
    tags = _tags(func, packet)
    if _POINTWISE is not None and _POINTWISE in tags:
        return like, "per output", 1, "elementwise"
    if (_REDUCTION is not None and _REDUCTION in tags) or packet in _REDUCTION_PACKETS:
        return like, "per input", 1, "reduction"
    if packet in _PER_ELEMENT:
        return like, "per element", 1, "other"
    if _composite(func):
        return DECOMPOSE
    return REFUSED  # no formula: refused where it runs (mode.py), never charged a guess


def _composite(func) -> bool:
    try:
        return torch._C._dispatch_has_kernel_for_dispatch_key(func.name(), "CompositeImplicitAutograd")
    except (AttributeError, RuntimeError):
        return False


def _registered(formula, args, kwargs, out) -> int:
    """torch's own formula. Most are wrapped to turn tensors into shapes with pytree, which is slow: unwrap them.
    An overload with an output dtype (`addmm(..., out_dtype=torch.float32)`, torch 2.9+) passes it positionally,
    where the formulas take the output's shape: it says nothing of the FLOPs and is left out."""
    on_shapes = getattr(formula, "__wrapped__", None)
    if on_shapes is None:
        return int(formula(*[a for a in args if not isinstance(a, _DTYPE)], **kwargs, out_val=out))
    shapes = []
    for a in args:
        if isinstance(a, _TENSOR):
            shapes.append(a.shape)
        elif not isinstance(a, _DTYPE):
            shapes.append(_shape(a))
    out_shape = out.shape if isinstance(out, _TENSOR) else _shape(out)
    if kwargs:
        return int(on_shapes(*shapes, out_shape=out_shape, **{k: _shape(v) for k, v in kwargs.items()}))
    return int(on_shapes(*shapes, out_shape=out_shape))


def _shape(x):
    if isinstance(x, _TENSOR):
        return x.shape
    if isinstance(x, _SEQUENCES):
        return type(x)(_shape(v) for v in x)
    return x


def _sparse_product(inputs, outputs) -> int:
    """A product with a sparse operand (torch.sparse.mm, addmm on a sparse matrix): 2 FLOPs per stored value and
    column of the dense side; a sparse-sparse product by the larger of the two, per output column."""
    sparse = [t for t in inputs if _is_sparse(t)]
    dense = [t for t in inputs if not _is_sparse(t) and t.dim() >= 1]
    cols = dense[-1].shape[-1] if dense else max((t.shape[-1] for t in outputs if t.dim()), default=1)
    return 2 * max(_numel(t) for t in sparse) * max(cols, 1)


def _vector_product(inputs, out_elements: int) -> int:
    """mv and addmv: 2 FLOPs per element of the matrix; dot, vdot, inner: 2 per element of a vector; addr and
    outer: 2 per element of the [n, m] result."""
    matrices = [t for t in inputs if t.dim() >= 2]
    if matrices and out_elements < max(t.numel() for t in matrices):  # a matrix times a vector
        return 2 * max(t.numel() for t in matrices)
    if out_elements <= 1:
        return 2 * max((t.numel() for t in inputs), default=0)
    return 2 * out_elements


def _attention(q: torch.Tensor, k: torch.Tensor, backward: bool) -> int:
    """Scaled dot-product attention of queries [..., s, d] against keys [..., s', d]: forward two products
    (Q·Kᵀ, P·V) and a softmax over the s·s' scores; backward four products and the softmax's backward."""
    batch = math.prod(q.shape[:-2])
    s, d, s2 = q.shape[-2], q.shape[-1], k.shape[-2]
    scores = batch * s * s2
    if backward:
        return 4 * 2 * scores * d + SOFTMAX_BACKWARD_FLOPS * scores
    return 2 * 2 * scores * d + SOFTMAX_FLOPS * scores


def _fft(x: torch.Tensor, dims) -> int:
    dims = list(range(x.dim())) if dims is None else [d % max(x.dim(), 1) for d in dims]
    n = math.prod(x.shape[d] for d in dims) if dims else 1
    return FFT_FLOPS * max(x.numel(), 1) * max(1, math.ceil(math.log2(max(n, 2))))


def _cubic(inputs) -> int:
    """A factorisation or solve of [..., n, n] matrices (with [..., n, k] right-hand sides): 2·n³ + 2·n²·k each,
    at least what multiplying the matrices would cost."""
    a = inputs[0]
    if a.dim() < 2:
        return max(a.numel(), 1)
    n = max(a.shape[-1], a.shape[-2])
    batch = math.prod(a.shape[:-2])
    k = sum(t.shape[-1] if t.dim() >= 2 else 1 for t in inputs[1:] if t.numel() > 1)
    return batch * (2 * n ** 3 + 2 * n * n * k)


def _cdist(inputs) -> int:
    """Distances between [..., P, M] and [..., R, M] rows: 3·P·R·M each (difference, square, sum)."""
    a, b = inputs[0], inputs[1]
    if a.dim() < 2 or b.dim() < 2:
        return max(a.numel(), b.numel())
    batch = math.prod(torch.broadcast_shapes(a.shape[:-2], b.shape[:-2])) if a.dim() > 2 or b.dim() > 2 else 1
    big = max(inputs, key=lambda t: t.numel())
    rows = a.shape[-2] * b.shape[-2] if a.shape[-1] == b.shape[-1] else big.numel()
    return 3 * batch * rows * a.shape[-1]


def _trilinear(args) -> int:
    """torch.nn.functional.bilinear's kernel: the three inputs expanded and multiplied, then summed: 2 FLOPs per
    element of the full product."""
    tensors = [a for a in args[:3] if isinstance(a, torch.Tensor)]
    expands = [list(e) for e in args[3:6]]
    shapes = []
    for t, expand in zip(tensors, expands):
        shape = list(t.shape)
        for d in sorted(expand):
            shape.insert(d, 1)
        shapes.append(shape)
    full = torch.broadcast_shapes(*shapes) if shapes else torch.Size()
    return 2 * math.prod(full)
