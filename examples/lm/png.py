"""A line plot written as a PNG with zlib alone (no plotting library to install).

Draws each curve as a coloured polyline on a white canvas with grey axes and a light grid; the
legend is printed by the caller (a PNG without a font cannot label itself).
"""

import struct
import zlib


def _chunk(kind, data):
    body = kind + data
    return struct.pack(">I", len(data)) + body + struct.pack(">I", zlib.crc32(body) & 0xFFFFFFFF)


def write_png(path, pixels, width, height):
    """pixels: bytearray of width * height * 3 (RGB, row-major)."""
    rows = b"".join(b"\x00" + bytes(pixels[y * width * 3:(y + 1) * width * 3])
                    for y in range(height))
    header = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    with open(path, "wb") as f:
        f.write(b"\x89PNG\r\n\x1a\n")
        f.write(_chunk(b"IHDR", header))
        f.write(_chunk(b"IDAT", zlib.compress(rows, 9)))
        f.write(_chunk(b"IEND", b""))


def plot_curves(path, curves, width=800, height=480, margin=40):
    """curves: [(values, (r, g, b))], all plotted on one x (index) and y (value) scale."""
    pixels = bytearray(b"\xff" * (width * height * 3))

    def put(x, y, color):
        if 0 <= x < width and 0 <= y < height:
            i = (y * width + x) * 3
            pixels[i:i + 3] = bytes(color)

    def line(x0, y0, x1, y1, color, thick=1):
        steps = max(abs(x1 - x0), abs(y1 - y0), 1)
        for s in range(steps + 1):
            x = round(x0 + (x1 - x0) * s / steps)
            y = round(y0 + (y1 - y0) * s / steps)
            for dx in range(thick):
                for dy in range(thick):
                    put(x + dx, y + dy, color)

    n = max(len(values) for values, _ in curves)
    lo = min(min(values) for values, _ in curves)
    hi = max(max(values) for values, _ in curves)
    span = (hi - lo) or 1.0

    def x_of(i):
        return margin + round(i * (width - 2 * margin) / max(n - 1, 1))

    def y_of(v):
        return height - margin - round((v - lo) * (height - 2 * margin) / span)

    for k in range(5):
        y = margin + round(k * (height - 2 * margin) / 4)
        line(margin, y, width - margin, y, (225, 225, 225))
    line(margin, height - margin, width - margin, height - margin, (120, 120, 120))
    line(margin, margin, margin, height - margin, (120, 120, 120))
    for values, color in curves:
        for i in range(1, len(values)):
            line(x_of(i - 1), y_of(values[i - 1]), x_of(i), y_of(values[i]), color, thick=2)
    write_png(path, pixels, width, height)
