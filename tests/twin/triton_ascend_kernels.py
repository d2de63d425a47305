"""``@triton.jit`` kernels for tests/twin/test_triton_ascend.py (Triton reads a kernel's source
from its file, so they cannot live in the tests' ``python -c`` scripts): small kernels that
call Triton-Ascend's extension ops the way vLLM-Ascend's kernels do (imported from
``triton.language.extra.cann.extension``), on shapes that are not powers of two."""

import triton
import triton.language as tl
from triton.language.extra.cann.extension import extract_slice, get_element, insert_slice


@triton.jit
def scalars_only(n):
    pass


@triton.jit
def copy_n(x_ptr, y_ptr, N: tl.constexpr):
    tl.store(y_ptr + tl.arange(0, N), tl.load(x_ptr + tl.arange(0, N)))


@triton.jit
def slices(x_ptr, off_ptr, ext_ptr, ins_ptr, elem_ptr, R: tl.constexpr, C: tl.constexpr):
    """x (R, C); o = *off_ptr (a dynamic offset): ext = x[o:o+2, 1:7:2], ins = x with
    x[0:4:2, 0:3] = 10 * ext, elem = x[o, C-1]."""
    rows = tl.arange(0, R)[:, None]
    cols = tl.arange(0, C)[None, :]
    x = tl.load(x_ptr + rows * C + cols)
    o = tl.load(off_ptr)
    e = extract_slice(x, (o, 1), (2, 3), (1, 2))
    tl.store(ext_ptr + tl.arange(0, 2)[:, None] * 3 + tl.arange(0, 3)[None, :], e)
    y = insert_slice(x, e * 10, (0, 0), (2, 3), (2, 1))
    tl.store(ins_ptr + rows * C + cols, y)
    tl.store(elem_ptr, get_element(x, (o, C - 1)))


@triton.jit
def misuse(x_ptr, y_ptr, CASE: tl.constexpr):
    """x (4, 4) fp32; i = int(*y_ptr) (3 when the test runs it): CASE breaks one rule."""
    x = tl.load(x_ptr + tl.arange(0, 4)[:, None] * 4 + tl.arange(0, 4)[None, :])
    i = tl.load(y_ptr).to(tl.int32)
    if CASE == 0:
        r = extract_slice(x, (i, 0), (2, 2), (1, 1))
    elif CASE == 1:
        r = insert_slice(x, extract_slice(x, (0, 0), (2, 2), (1, 1)), (0, 0), (2, 3), (1, 1))
    elif CASE == 2:
        r = insert_slice(x, extract_slice(x, (0, 0), (2, 2), (1, 1)).to(tl.int32), (0, 0),
                         (2, 2), (1, 1))
    elif CASE == 3:
        r = extract_slice(x, (0,), (2,), (1,))
    elif CASE == 4:
        r = extract_slice(x, (0, 0), (2, 2), (1, -1))
    elif CASE == 5:
        r = get_element(x, (i,))
    elif CASE == 6:
        r = get_element(x, (i + 1, 0))
    elif CASE == 7:
        r = extract_slice(x, (0, 0), (i, 2), (1, 1))
    elif CASE == 8:
        r = extract_slice(x > 0, (0, 0), (2, 2), (1, 1))
    else:
        r = insert_slice(x, x, (0, i), (4, 4), (1, 1))
    tl.store(y_ptr, tl.sum(r.to(tl.float32)))


@triton.jit
def bool_element(x_ptr, out_ptr, N: tl.constexpr):
    """out[k] = int32(get_element(x > 0 & mask, (k,))) for k < N: a bool element read the way
    vLLM-Ascend's rejection_greedy_sample_triton reads its is_greedy_mask."""
    offs = tl.arange(0, N)
    mask = offs < N
    positive = mask & (tl.load(x_ptr + offs) > 0)
    for k in tl.range(0, N):
        flag = get_element(positive, (k,))
        tl.store(out_ptr + k, 1 if flag else 0)


@triton.jit
def bf16_math(a_ptr, b_ptr, c_ptr, x_ptr, out_ptr, neg_ptr, lt_ptr, cast_ptr, red_ptr,
              N: tl.constexpr):
    """bf16 arithmetic as vLLM-Ascend's RoPE kernels do it: out = a * b - c, neg = -a,
    lt = a < b (int8), cast = x (fp32) rounded to bf16, red = [sum(a), min(a), max(a)]."""
    i = tl.arange(0, N)
    a = tl.load(a_ptr + i)
    b = tl.load(b_ptr + i)
    c = tl.load(c_ptr + i)
    tl.store(out_ptr + i, a * b - c)
    tl.store(neg_ptr + i, -a)
    tl.store(lt_ptr + i, (a < b).to(tl.int8))
    tl.store(cast_ptr + i, tl.load(x_ptr + i).to(tl.bfloat16))
    tl.store(red_ptr, tl.sum(a, axis=0))
    tl.store(red_ptr + 1, tl.min(a, axis=0))
    tl.store(red_ptr + 2, tl.max(a, axis=0))


@triton.jit
def bf16_dot(x_ptr, a_ptr, o_ptr, M: tl.constexpr, K: tl.constexpr, N: tl.constexpr):
    """``o = x @ a.T`` of bf16 tiles into a float32 accumulator, as vLLM-Ascend's LoRA shrink
    kernel (``lora/lora_ops.py`` ``_lora_shrink_splitk_kernel``) does."""
    m, k, n = tl.arange(0, M), tl.arange(0, K), tl.arange(0, N)
    x = tl.load(x_ptr + m[:, None] * K + k[None, :])
    a = tl.load(a_ptr + n[:, None] * K + k[None, :])
    acc = tl.zeros((M, N), dtype=tl.float32)
    acc += tl.dot(x, tl.trans(a))
    tl.store(o_ptr + m[:, None] * N + n[None, :], acc)
