"""A dependency-free line chart written as a PNG (zlib + struct from the standard library), for
machines without matplotlib: axes, grid, tick labels and a legend in a built-in 5x7 bitmap font.

    write_line_chart("loss.png", {"BF16": (steps, losses), "MXFP8": (steps, losses)},
                     title="LOSS", x_label="STEP", y_label="LOSS")
"""

import math
import struct
import zlib

# 5x7 glyphs, one byte per row, bit 4 = leftmost column. Lower case is drawn as upper case.
_FONT = {
    "0": (0x0E, 0x11, 0x13, 0x15, 0x19, 0x11, 0x0E), "1": (0x04, 0x0C, 0x04, 0x04, 0x04, 0x04, 0x0E),
    "2": (0x0E, 0x11, 0x01, 0x02, 0x04, 0x08, 0x1F), "3": (0x1F, 0x02, 0x04, 0x02, 0x01, 0x11, 0x0E),
    "4": (0x02, 0x06, 0x0A, 0x12, 0x1F, 0x02, 0x02), "5": (0x1F, 0x10, 0x1E, 0x01, 0x01, 0x11, 0x0E),
    "6": (0x06, 0x08, 0x10, 0x1E, 0x11, 0x11, 0x0E), "7": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x08, 0x08),
    "8": (0x0E, 0x11, 0x11, 0x0E, 0x11, 0x11, 0x0E), "9": (0x0E, 0x11, 0x11, 0x0F, 0x01, 0x02, 0x0C),
    "A": (0x0E, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11), "B": (0x1E, 0x11, 0x11, 0x1E, 0x11, 0x11, 0x1E),
    "C": (0x0E, 0x11, 0x10, 0x10, 0x10, 0x11, 0x0E), "D": (0x1C, 0x12, 0x11, 0x11, 0x11, 0x12, 0x1C),
    "E": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x1F), "F": (0x1F, 0x10, 0x10, 0x1E, 0x10, 0x10, 0x10),
    "G": (0x0E, 0x11, 0x10, 0x17, 0x11, 0x11, 0x0F), "H": (0x11, 0x11, 0x11, 0x1F, 0x11, 0x11, 0x11),
    "I": (0x0E, 0x04, 0x04, 0x04, 0x04, 0x04, 0x0E), "J": (0x07, 0x02, 0x02, 0x02, 0x02, 0x12, 0x0C),
    "K": (0x11, 0x12, 0x14, 0x18, 0x14, 0x12, 0x11), "L": (0x10, 0x10, 0x10, 0x10, 0x10, 0x10, 0x1F),
    "M": (0x11, 0x1B, 0x15, 0x15, 0x11, 0x11, 0x11), "N": (0x11, 0x11, 0x19, 0x15, 0x13, 0x11, 0x11),
    "O": (0x0E, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "P": (0x1E, 0x11, 0x11, 0x1E, 0x10, 0x10, 0x10),
    "Q": (0x0E, 0x11, 0x11, 0x11, 0x15, 0x12, 0x0D), "R": (0x1E, 0x11, 0x11, 0x1E, 0x14, 0x12, 0x11),
    "S": (0x0F, 0x10, 0x10, 0x0E, 0x01, 0x01, 0x1E), "T": (0x1F, 0x04, 0x04, 0x04, 0x04, 0x04, 0x04),
    "U": (0x11, 0x11, 0x11, 0x11, 0x11, 0x11, 0x0E), "V": (0x11, 0x11, 0x11, 0x11, 0x11, 0x0A, 0x04),
    "W": (0x11, 0x11, 0x11, 0x15, 0x15, 0x15, 0x0A), "X": (0x11, 0x11, 0x0A, 0x04, 0x0A, 0x11, 0x11),
    "Y": (0x11, 0x11, 0x0A, 0x04, 0x04, 0x04, 0x04), "Z": (0x1F, 0x01, 0x02, 0x04, 0x08, 0x10, 0x1F),
    ".": (0, 0, 0, 0, 0, 0x0C, 0x0C), "-": (0, 0, 0, 0x1F, 0, 0, 0), ":": (0, 0x0C, 0x0C, 0, 0x0C, 0x0C, 0),
    " ": (0, 0, 0, 0, 0, 0, 0), "%": (0x18, 0x19, 0x02, 0x04, 0x08, 0x13, 0x03),
    "(": (0x02, 0x04, 0x08, 0x08, 0x08, 0x04, 0x02), ")": (0x08, 0x04, 0x02, 0x02, 0x02, 0x04, 0x08),
    "=": (0, 0, 0x1F, 0, 0x1F, 0, 0), ",": (0, 0, 0, 0, 0x0C, 0x04, 0x08), "/": (0, 0x01, 0x02, 0x04, 0x08, 0x10, 0),
    "+": (0, 0x04, 0x04, 0x1F, 0x04, 0x04, 0), "_": (0, 0, 0, 0, 0, 0, 0x1F),
}
_UNKNOWN = (0x1F, 0x11, 0x11, 0x11, 0x11, 0x11, 0x1F)

COLORS = [(31, 119, 180), (255, 127, 14), (44, 160, 44), (214, 39, 40), (148, 103, 189)]


class Canvas:
    def __init__(self, width, height, background=(255, 255, 255)):
        self.width, self.height = width, height
        self.pixels = bytearray(bytes(background) * (width * height))

    def set(self, x, y, color):
        if 0 <= x < self.width and 0 <= y < self.height:
            i = 3 * (y * self.width + x)
            self.pixels[i:i + 3] = bytes(color)

    def rect(self, x0, y0, x1, y1, color):
        for y in range(max(y0, 0), min(y1, self.height)):
            for x in range(max(x0, 0), min(x1, self.width)):
                self.set(x, y, color)

    def line(self, x0, y0, x1, y1, color, width=1):
        """Bresenham, thickened by a square brush."""
        x0, y0, x1, y1 = int(round(x0)), int(round(y0)), int(round(x1)), int(round(y1))
        dx, dy = abs(x1 - x0), -abs(y1 - y0)
        sx, sy = (1 if x0 < x1 else -1), (1 if y0 < y1 else -1)
        err = dx + dy
        lo, hi = -(width // 2), width - width // 2
        while True:
            for oy in range(lo, hi):
                for ox in range(lo, hi):
                    self.set(x0 + ox, y0 + oy, color)
            if x0 == x1 and y0 == y1:
                return
            e2 = 2 * err
            if e2 >= dy:
                err += dy
                x0 += sx
            if e2 <= dx:
                err += dx
                y0 += sy

    def text(self, x, y, s, color=(0, 0, 0), scale=2, vertical=False):
        """Draws s with its top-left corner at (x, y) (bottom-left, reading upwards, when vertical)."""
        for n, ch in enumerate(s.upper()):
            glyph = _FONT.get(ch, _UNKNOWN)
            for row, bits in enumerate(glyph):
                for col in range(5):
                    if bits & (0x10 >> col):
                        for a in range(scale):
                            for b in range(scale):
                                u, v = (n * 6 + col) * scale + a, row * scale + b
                                if vertical:
                                    self.set(x + v, y - u, color)
                                else:
                                    self.set(x + u, y + v, color)

    def png(self):
        raw = b"".join(b"\x00" + bytes(self.pixels[3 * y * self.width:3 * (y + 1) * self.width])
                       for y in range(self.height))

        def chunk(kind, data):
            return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data))

        header = struct.pack(">IIBBBBB", self.width, self.height, 8, 2, 0, 0, 0)  # 8-bit RGB
        return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(raw, 9)) + \
            chunk(b"IEND", b"")


def text_width(s, scale=2):
    return len(s) * 6 * scale


def nice_ticks(lo, hi, count=6):
    """Round tick values covering [lo, hi]."""
    if hi <= lo:
        hi = lo + 1.0
    raw = (hi - lo) / max(count - 1, 1)
    mag = 10 ** math.floor(math.log10(raw))
    step = next(m * mag for m in (1, 2, 2.5, 5, 10) if m * mag >= raw)
    first = math.floor(lo / step) * step
    ticks, t = [], first
    while t <= hi + step * 1e-9:
        ticks.append(round(t, 10))
        t += step
    if ticks[-1] < hi:
        ticks.append(round(t, 10))
    return ticks


def _label(v):
    return f"{v:g}" if abs(v) >= 1e-3 or v == 0 else f"{v:.1e}"


def write_line_chart(path, series, title="", x_label="", y_label="", width=900, height=540, markers=None,
                     subtitle=""):
    """series: {name: (xs, ys)} drawn as lines; markers: optional {name: (xs, ys)} drawn as squares in
    the colour of the series of the same name (or the next colour); subtitle: a line under the title."""
    markers = markers or {}
    canvas = Canvas(width, height)
    left, right, top, bottom = 90, 30, 64, 70
    pw, ph = width - left - right, height - top - bottom
    xs = [x for s in list(series.values()) + list(markers.values()) for x in s[0]]
    ys = [y for s in list(series.values()) + list(markers.values()) for y in s[1] if math.isfinite(y)]
    xt = nice_ticks(min(xs), max(xs))
    yt = nice_ticks(min(ys), max(ys))
    x0, x1, y0, y1 = xt[0], xt[-1], yt[0], yt[-1]

    def px(x):
        return left + (x - x0) / (x1 - x0) * pw

    def py(y):
        return top + ph - (y - y0) / (y1 - y0) * ph

    grid, axis = (225, 225, 225), (60, 60, 60)
    for t in xt:
        canvas.line(px(t), top, px(t), top + ph, grid)
        label = _label(t)
        canvas.text(int(px(t)) - text_width(label) // 2, top + ph + 8, label, axis)
    for t in yt:
        canvas.line(left, py(t), left + pw, py(t), grid)
        label = _label(t)
        canvas.text(left - 8 - text_width(label), int(py(t)) - 7, label, axis)
    canvas.line(left, top, left, top + ph, axis)
    canvas.line(left, top + ph, left + pw, top + ph, axis)
    canvas.text((width - text_width(title)) // 2, 14, title, (0, 0, 0))
    if subtitle:
        canvas.text((width - text_width(subtitle)) // 2, 36, subtitle, (90, 90, 90))
    canvas.text(left + (pw - text_width(x_label)) // 2, height - 30, x_label, axis)
    canvas.text(18, top + (ph + text_width(y_label)) // 2, y_label, axis, vertical=True)

    colors = {}
    for i, (name, (sx, sy)) in enumerate(series.items()):
        color = colors.setdefault(name, COLORS[i % len(COLORS)])
        points = [(px(x), py(y)) for x, y in zip(sx, sy) if math.isfinite(y)]
        for (a, b), (c, d) in zip(points, points[1:]):
            canvas.line(a, b, c, d, color, width=2)
    for i, (name, (mx, my)) in enumerate(markers.items()):
        color = colors.get(name, COLORS[(len(series) + i) % len(COLORS)])
        r = max(6 - 2 * i, 2)  # later markers smaller, so that coinciding ones stay visible
        for x, y in zip(mx, my):
            if math.isfinite(y):
                canvas.rect(int(px(x)) - r, int(py(y)) - r, int(px(x)) + r + 1, int(py(y)) + r + 1, color)

    # Legend, top right inside the plot.
    names = list(series)
    lw = max(text_width(n) for n in names) + 50
    lx, ly = left + pw - lw - 10, top + 10
    canvas.rect(lx, ly, lx + lw, ly + 12 + 24 * len(names), (255, 255, 255))
    for i, name in enumerate(names):
        yy = ly + 10 + 24 * i
        canvas.line(lx + 8, yy + 7, lx + 36, yy + 7, colors[name], width=3)
        canvas.text(lx + 44, yy, name, (0, 0, 0))
    with open(path, "wb") as f:
        f.write(canvas.png())
