"""Served bytes <-> torch tensors.

A pull delivers one byte buffer: the data (row-major), then the scales. These helpers view it
in place as torch tensors of the served dtype and dequantize it to float32 with the rules of
DESIGN.md section 3, so the module gets exactly the values the daemon's recipe encodes.
"""

import warnings
from collections import namedtuple

import torch

# What a trainer can use directly: `data` in the served dtype (float8_e4m3fn for the FP8 recipes),
# `scale` as the recipe stores it (float32 scale_inv values, or uint8 E8M0 exponents for mxfp8;
# None for fp32, bf16 and fp16), both shaped as the header says.
ServedWeight = namedtuple(
    "ServedWeight", "data scale scale_type format version rows cols skipped")

_DATA_DTYPES = {
    "fp32": torch.float32,
    "bf16": torch.bfloat16,
    "fp16": torch.float16,
    "fp8_tensor": torch.float8_e4m3fn,
    "fp8_delayed": torch.float8_e4m3fn,
    "fp8_block": torch.float8_e4m3fn,
    "mxfp8": torch.float8_e4m3fn,
}

_GRAD_TYPES = {torch.float32: "fp32", torch.bfloat16: "bf16"}


def recipe_of(fmt):
    """'mxfp8:columnwise' -> 'mxfp8'."""
    return fmt.split(":", 1)[0]


def is_columnwise(fmt):
    return fmt.endswith(":columnwise")


def is_plain(fmt):
    """Whether a format's data are the weights themselves (fp32, bf16, fp16; rowwise)."""
    return recipe_of(fmt) in ("fp32", "bf16", "fp16") and not is_columnwise(fmt)


def data_dtype(fmt):
    """The torch dtype of a format's data."""
    return _DATA_DTYPES[recipe_of(fmt)]


def check_format(fmt):
    if recipe_of(fmt) not in _DATA_DTYPES:
        raise ValueError(f"unknown serve format {fmt!r}; one of {sorted(_DATA_DTYPES)}, "
                         "optionally with ':columnwise'")
    return fmt


def byte_view(tensor):
    """The bytes of a tensor, in place: a uint8 numpy array over a CPU tensor's memory, or a flat
    uint8 CUDA tensor over a GPU tensor's (the bindings read it through its
    __cuda_array_interface__; only a transport whose traits say it reads device memory takes GPU memory). Non-contiguous
    tensors are copied first."""
    flat = tensor.detach().contiguous().reshape(-1).view(torch.uint8)
    if flat.device.type == "cuda":
        return flat
    if flat.device.type != "cpu":
        raise ValueError(f"paramd reads CPU or CUDA tensors, not {flat.device.type} ones")
    return flat.numpy()


def grad_type_of(dtype):
    """The wire type of gradients of a parameter of `dtype` (others are sent as fp32)."""
    return _GRAD_TYPES.get(dtype, "fp32")


def served(pulled):
    """Views a pull (paramd._paramd.PulledBytes or PulledView) as a ServedWeight, without copying
    the data."""
    if getattr(pulled, "released", False):
        raise ValueError("this in-place view was released; pull again")
    if getattr(pulled, "on_device", False):
        # GPU memory (cuda_ipc): a CUDA tensor over the daemon's bytes, through the view's
        # __cuda_array_interface__; the tensor keeps the view, and so its lease, alive.
        raw = torch.as_tensor(pulled)
    else:
        raw = host_bytes(pulled)
    return served_view(raw, pulled.fields)


def host_bytes(buffer):
    """A uint8 CPU tensor over a buffer's bytes (a pull's, in place or copied), no copy."""
    with warnings.catch_warnings():
        # An in-place view is a read-only buffer; torch warns that it views it.
        warnings.filterwarnings("ignore", message="The given buffer is not writable")
        return torch.frombuffer(buffer, dtype=torch.uint8)


def block_tensors(batch):
    """The blocks of a PulledBatch as uint8 tensors (CUDA ones over GPU memory), each keeping the
    batch's leases alive."""
    if batch.released:
        raise ValueError("this batch of in-place views was released; pull again")
    if batch.on_device:
        return [torch.as_tensor(b) for b in batch.blocks]
    return [host_bytes(b) for b in batch.blocks]


def served_batch(batch, blocks=None):
    """Every tensor of a PulledBatch as a ServedWeight, each sliced from its block's tensor
    (`blocks`: block_tensors(batch), when the caller has them)."""
    blocks = block_tensors(batch) if blocks is None else blocks
    return [served_view(blocks[b][offset:offset + fields[3] + fields[4]], fields)
            for b, offset, fields in batch.spans]


def served_view(raw, fields):
    """A ServedWeight over `raw`, the uint8 tensor of one pull's bytes (data, then scales), whose
    header fields are `fields` (a pull's .fields tuple)."""
    fmt, rows, cols, data_bytes, scale_bytes, scale_type, scale_shape, version, skipped = fields
    dtype = _DATA_DTYPES[recipe_of(fmt)]
    data = raw[:data_bytes].view(dtype)
    # Columnwise data is the transpose, except mxfp8's, which keeps [rows, cols].
    if is_columnwise(fmt) and recipe_of(fmt) != "mxfp8":
        data = data.view(cols, rows)
    else:
        data = data.view(rows, cols)
    scale = None
    if scale_bytes:
        scale_raw = raw[data_bytes:]
        if scale_type == "e8m0":
            scale = scale_raw.view(scale_shape)
        else:
            if scale_raw.data_ptr() % 4:
                # Scales follow data of any byte count: a misaligned float32 view is refused, so
                # they are copied (tiny; on the GPU the copy is queued on the current stream).
                scale_raw = scale_raw.clone()
            scale = scale_raw.view(torch.float32).view(scale_shape)
    return ServedWeight(data, scale, scale_type, fmt, version, rows, cols, skipped)


def join_pieces(parts):
    """A tensor split over daemons as one ServedWeight, from its pieces' ServedWeights in row
    order: their data and scales side by side along the rows (dim 1 of a transposed layout), a
    per-tensor scale, which every owner serves alike, once. A copy (torch.cat)."""
    first = parts[0]
    fmt = first.format
    dim = 1 if is_columnwise(fmt) and recipe_of(fmt) != "mxfp8" else 0
    data = torch.cat([p.data for p in parts], dim=dim)
    scale = first.scale
    if scale is not None and recipe_of(fmt) not in ("fp8_tensor", "fp8_delayed"):
        scale = torch.cat([p.scale for p in parts], dim=dim)
    return ServedWeight(data, scale, first.scale_type, fmt, first.version,
                        sum(p.rows for p in parts), first.cols, first.skipped)


def _expand_blocks(scale, block_rows, block_cols, rows, cols):
    """Repeats per-block values over their blocks and cuts the partial edge blocks."""
    out = scale.repeat_interleave(block_rows, dim=0)[:rows]
    return out.repeat_interleave(block_cols, dim=1)[:, :cols]


def _e8m0_values(codes):
    """E8M0 codes -> 2^(code - 127) as float32; code 255 is NaN."""
    exponent = codes.to(torch.int32) - 127
    values = torch.ldexp(torch.ones(codes.shape, dtype=torch.float32, device=codes.device),
                         exponent)
    return torch.where(codes == 255, torch.full_like(values, float("nan")), values)


def dequantize(weight):
    """A ServedWeight as float32 [rows, cols] (the module's layout, whatever the direction)."""
    recipe = recipe_of(weight.format)
    columnwise = is_columnwise(weight.format)
    values = weight.data.float()
    if recipe in ("fp8_tensor", "fp8_delayed"):
        values = values * weight.scale.reshape(())
    elif recipe == "fp8_block":
        r, c = values.shape
        values = values * _expand_blocks(weight.scale, 128, 128, r, c)
    elif recipe == "mxfp8":
        r, c = values.shape
        if columnwise:
            values = values * _expand_blocks(_e8m0_values(weight.scale), 32, 1, r, c)
        else:
            values = values * _expand_blocks(_e8m0_values(weight.scale), 1, 32, r, c)
    if columnwise and recipe != "mxfp8":
        values = values.t()
    return values
