"""The pictures of the procedural triplets (`data_tools.synth`): content scenes (`make_content`: shapes,
horizons, skylines, seascapes, mountains, gradients) and styles (`make_style`: a palette of 3-5 colours, dark to
light, painted as a texture). Every picture is drawn from the `numpy.random.Generator` it is given.
"""
from __future__ import annotations

import colorsys
from dataclasses import dataclass

import numpy as np
from PIL import Image

CONTENT_KINDS = ("shapes", "horizon", "skyline", "sun", "mountains", "gradient")
STYLE_KINDS = ("stripes", "dots", "noise", "brush", "checker", "waves")

Array = np.ndarray


@dataclass(frozen=True)
class Style:
    """A palette (n, 3) float in [0, 255], sorted by luminance, and its rendered image (S, S, 3)."""

    palette: Array
    image: Array


def _grid(size: int) -> tuple[Array, Array]:
    """Pixel-centre coordinates in [0, 1): (yy, xx), each (S, S) float32."""
    t = (np.arange(size, dtype=np.float32) + 0.5) / size
    return np.meshgrid(t, t, indexing="ij")


def luma(img_HW3: Array) -> Array:
    return img_HW3 @ np.array([0.299, 0.587, 0.114], dtype=np.float32)


def _alpha(dist_in: Array, size: int) -> Array:
    """Soft coverage from a signed distance (positive inside, in image units): ~1 px anti-aliasing."""
    return np.clip(dist_in * size + 0.5, 0.0, 1.0)


def _paint(canvas_HW3: Array, alpha_HW: Array, colour: Array) -> None:
    canvas_HW3 += alpha_HW[..., None] * (np.asarray(colour, dtype=np.float32) - canvas_HW3)


def _colour(rng: np.random.Generator, v_lo: float = 0.1, v_hi: float = 1.0) -> Array:
    h, s, v = rng.random(), rng.uniform(0.15, 0.9), rng.uniform(v_lo, v_hi)
    return np.array(colorsys.hsv_to_rgb(h, s, v), dtype=np.float32) * 255.0


def _value_noise(rng: np.random.Generator, size: int, cells: int, aspect: float = 1.0) -> Array:
    """Smooth noise (S, S) in about [0, 1]: a random (cells x cells*aspect) grid upsampled bicubically."""
    gh, gw = max(2, cells), max(2, round(cells * aspect))
    grid = rng.random((gh, gw), dtype=np.float32)
    return np.asarray(Image.fromarray(grid, "F").resize((size, size), Image.BICUBIC), dtype=np.float32)


def _gradient(rng: np.random.Generator, yy: Array, xx: Array) -> Array:
    """A linear two-colour gradient (S, S, 3), mostly vertical like a sky."""
    c0, c1 = _colour(rng, 0.4, 1.0), _colour(rng, 0.2, 1.0)
    theta = np.pi / 2 + rng.uniform(-0.6, 0.6)
    t = np.cos(theta) * xx + np.sin(theta) * yy
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    return c0 + t[..., None] * (c1 - c0)


def _shapes(
    rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int, n_min: int = 3, n_max: int = 8
) -> None:
    for _ in range(rng.integers(n_min, n_max + 1)):
        kind = rng.integers(0, 4)
        cy, cx = rng.uniform(0.1, 0.9, 2)
        r = rng.uniform(0.06, 0.25)
        if kind == 0:  # disk
            d = r - np.hypot(yy - cy, xx - cx)
        elif kind == 1:  # ellipse (approximate distance)
            a, b = r, r * rng.uniform(0.3, 0.8)
            th = rng.uniform(0, np.pi)
            u = (xx - cx) * np.cos(th) + (yy - cy) * np.sin(th)
            w = -(xx - cx) * np.sin(th) + (yy - cy) * np.cos(th)
            d = (1.0 - np.sqrt((u / a) ** 2 + (w / b) ** 2)) * b
        elif kind == 2:  # rotated rectangle
            th = rng.uniform(0, np.pi / 2)
            hw, hh = r, r * rng.uniform(0.3, 1.0)
            u = (xx - cx) * np.cos(th) + (yy - cy) * np.sin(th)
            w = -(xx - cx) * np.sin(th) + (yy - cy) * np.cos(th)
            d = np.minimum(hw - np.abs(u), hh - np.abs(w))
        else:  # triangle from three half-planes
            angles = rng.uniform(0, 2 * np.pi) + np.array([0.0, 2.1, 4.2]) + rng.uniform(-0.3, 0.3, 3)
            px, py = cx + r * np.cos(angles), cy + r * np.sin(angles)
            d = np.full_like(xx, np.inf)
            for i in range(3):
                x0, y0, x1, y1 = px[i], py[i], px[(i + 1) % 3], py[(i + 1) % 3]
                nx, ny = y1 - y0, -(x1 - x0)
                norm = np.hypot(nx, ny)
                sign = np.sign(nx * (px[(i + 2) % 3] - x0) + ny * (py[(i + 2) % 3] - y0)) or 1.0
                d = np.minimum(d, sign * (nx * (xx - x0) + ny * (yy - y0)) / norm)
        _paint(canvas, _alpha(d, size), _colour(rng))


def _horizon(rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int) -> None:
    h0 = rng.uniform(0.45, 0.8)
    amp, freq, phase = rng.uniform(0.0, 0.06), rng.uniform(0.5, 3.0), rng.uniform(0, 2 * np.pi)
    line = h0 + amp * np.sin(2 * np.pi * freq * xx + phase)
    ground = _colour(rng, 0.1, 0.7)
    far = _colour(rng, 0.2, 0.9)
    t = np.clip((yy - h0) / max(1.0 - h0, 1e-3), 0, 1)[..., None]
    _paint(canvas, _alpha(yy - line, size), far + t * (ground - far))


def _skyline(rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int) -> None:
    top = np.full(size, 2.0, dtype=np.float32)  # per column, in image units (y down)
    x = 0.0
    while x < 1.0:
        w = rng.uniform(0.05, 0.16)
        h = rng.uniform(0.3, 0.85)
        lo, hi = int(x * size), int(min(x + w, 1.0) * size)
        top[lo:hi] = np.minimum(top[lo:hi], 1.0 - h)
        x += w + rng.uniform(0.0, 0.04)
    body = _colour(rng, 0.05, 0.45)
    mask = _alpha(yy - top[None, :], size)
    _paint(canvas, mask, body)
    step = max(3, size // rng.integers(16, 28))
    iy, ix = np.indices((size, size))
    lit = (iy % step < step // 2) & (ix % step < step // 2) & (yy > top[None, :] + 0.03)
    lit &= rng.random((size // step + 1, size // step + 1))[iy // step, ix // step] < 0.5
    _paint(canvas, lit.astype(np.float32) * mask, _colour(rng, 0.7, 1.0))


def _sun(rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int) -> None:
    cy, cx, r = rng.uniform(0.2, 0.5), rng.uniform(0.2, 0.8), rng.uniform(0.08, 0.2)
    dist = np.hypot(yy - cy, xx - cx)
    sun = _colour(rng, 0.8, 1.0)
    for k in range(3, 0, -1):  # halo rings
        _paint(canvas, 0.25 * _alpha(r * (1 + 0.5 * k) - dist, size), sun)
    _paint(canvas, _alpha(r - dist, size), sun)
    sea_y = rng.uniform(max(cy + r * 0.5, 0.55), 0.85)
    sea = _colour(rng, 0.1, 0.6)
    _paint(canvas, _alpha(yy - sea_y, size), sea)
    # reflection: horizontal streaks under the sun
    streak = (np.sin(yy * size * 0.8) > 0.3) & (np.abs(xx - cx) < r * (1.2 - (yy - sea_y)))
    _paint(canvas, 0.7 * (streak & (yy > sea_y)).astype(np.float32), sun)


def _mountains(rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int) -> None:
    n_ranges = int(rng.integers(2, 4))
    for j in range(n_ranges):
        base = 0.45 + 0.15 * j + rng.uniform(-0.05, 0.05)
        top = np.full(size, base + 0.3, dtype=np.float32)
        x = xx[0]
        for _ in range(rng.integers(2, 6)):
            px, py = rng.uniform(-0.1, 1.1), base - rng.uniform(0.1, 0.35)
            top = np.minimum(top, py + rng.uniform(0.6, 2.0) * np.abs(x - px))
        top += 0.01 * (_value_noise(rng, size, 24)[0] - 0.5)
        colour = _colour(rng, 0.15 + 0.5 * (n_ranges - 1 - j) / n_ranges, 0.95 - 0.2 * j)
        _paint(canvas, _alpha(yy - top[None, :], size), colour)


def _banded_gradient(rng: np.random.Generator, canvas: Array, yy: Array, xx: Array, size: int) -> None:
    cy, cx = rng.uniform(0, 1, 2)
    radial = np.hypot(yy - cy, xx - cx)
    bands = np.floor(radial * rng.uniform(3, 8)) % 2
    _paint(canvas, 0.35 * bands.astype(np.float32), _colour(rng))
    _shapes(rng, canvas, yy, xx, size, 1, 3)


_SCENES = {
    "shapes": (_shapes,),
    "horizon": (_horizon, _shapes),
    "skyline": (_skyline,),
    "sun": (_sun,),
    "mountains": (_mountains,),
    "gradient": (_banded_gradient,),
}


def make_content(rng: np.random.Generator, size: int, kind: str | None = None) -> Array:
    """A procedural scene: (S, S, 3) float32 in [0, 255]."""
    kind = kind or CONTENT_KINDS[rng.integers(len(CONTENT_KINDS))]
    if kind not in _SCENES:
        raise ValueError(f"content kind must be one of {CONTENT_KINDS}, not {kind!r}")
    yy, xx = _grid(size)
    canvas = _gradient(rng, yy, xx)
    for layer in _SCENES[kind]:
        if layer is _shapes and kind != "shapes":
            layer(rng, canvas, yy, xx, size, 0, 2)
        else:
            layer(rng, canvas, yy, xx, size)
    return np.clip(canvas, 0.0, 255.0)


def make_palette(rng: np.random.Generator) -> Array:
    """3-5 colours (n, 3) float32 in [0, 255], sorted dark to light by luminance."""
    n = int(rng.integers(3, 6))
    h0 = rng.random()
    scheme = rng.integers(0, 4)
    if scheme == 0:  # analogous
        hues = h0 + np.arange(n) * rng.uniform(0.04, 0.1)
    elif scheme == 1:  # complementary
        hues = h0 + 0.5 * (np.arange(n) % 2) + rng.uniform(-0.04, 0.04, n)
    elif scheme == 2:  # triadic
        hues = h0 + np.arange(n) / 3.0
    else:
        hues = rng.random(n)
    values = np.linspace(rng.uniform(0.15, 0.35), rng.uniform(0.8, 1.0), n)
    rng.shuffle(values)
    sats = rng.uniform(0.35, 0.95, n)
    cols = np.array([colorsys.hsv_to_rgb(h % 1.0, s, v) for h, s, v in zip(hues, sats, values)], np.float32)
    cols *= 255.0
    return cols[np.argsort(luma(cols), kind="stable")]


def _rotated(rng: np.random.Generator, yy: Array, xx: Array) -> tuple[Array, Array]:
    th = rng.uniform(0, np.pi)
    return xx * np.cos(th) + yy * np.sin(th), -xx * np.sin(th) + yy * np.cos(th)


def _tex_stripes(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    u, w = _rotated(rng, yy, xx)
    u = u + rng.uniform(0, 0.05) * np.sin(2 * np.pi * rng.uniform(1, 4) * w)
    v = np.floor(u / rng.uniform(0.04, 0.14)) % n
    return v, np.ones_like(v)


def _tex_dots(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    u, w = _rotated(rng, yy, xx)
    sp = rng.uniform(0.06, 0.16)
    row = np.floor(w / sp)
    u = u + 0.5 * sp * (row % 2)  # hexagonal offset
    col = np.floor(u / sp)
    du, dw = u - (col + 0.5) * sp, w - (row + 0.5) * sp
    inside = _alpha(sp * rng.uniform(0.2, 0.45) - np.hypot(du, dw), size)
    dot_index = 1 + (col + 2 * row) % (n - 1)
    return inside * dot_index, np.ones_like(u)


def _tex_noise(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    t = sum(_value_noise(rng, size, c) * a for c, a in ((4, 1.0), (9, 0.5), (20, 0.25)))
    t = (t - t.min()) / max(float(t.max() - t.min()), 1e-6)
    v = t * (n - 1)
    if rng.random() < 0.5:
        v = np.round(v)
    return v, np.ones_like(v)


def _tex_brush(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    v = np.full_like(xx, float(rng.integers(n)))
    shade = np.ones_like(xx)
    theta0 = rng.uniform(0, np.pi)
    n_strokes = int(rng.integers(60, 140))
    for _ in range(n_strokes):
        cy, cx = rng.uniform(-0.05, 1.05, 2)
        length, width = rng.uniform(0.08, 0.25), rng.uniform(0.015, 0.05)
        th = theta0 + rng.normal(0, 0.25)
        reach = length + width
        y0, y1 = max(0, int((cy - reach) * size)), min(size, int((cy + reach) * size) + 1)
        x0, x1 = max(0, int((cx - reach) * size)), min(size, int((cx + reach) * size) + 1)
        if y0 >= y1 or x0 >= x1:
            continue
        sy, sx = yy[y0:y1, x0:x1] - cy, xx[y0:y1, x0:x1] - cx
        u = sx * np.cos(th) + sy * np.sin(th)
        w = -sx * np.sin(th) + sy * np.cos(th)
        a = _alpha(width * (1.0 - np.sqrt((u / length) ** 2 + (w / width) ** 2)), size)
        idx = float(rng.integers(n))
        v[y0:y1, x0:x1] += a * (idx - v[y0:y1, x0:x1])
        bristles = 1.0 + 0.12 * np.sin(w * size * rng.uniform(1.5, 3.0))
        shade[y0:y1, x0:x1] += a * (bristles - shade[y0:y1, x0:x1])
    return np.round(v), shade


def _tex_checker(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    u, w = _rotated(rng, yy, xx) if rng.random() < 0.5 else (xx, yy)
    cell = rng.uniform(0.06, 0.2)
    i, j = np.floor(u / cell), np.floor(w / cell)
    k = int(rng.integers(1, n))
    return (i + k * j) % n, np.ones_like(u)


def _tex_waves(rng: np.random.Generator, n: int, yy: Array, xx: Array, size: int) -> tuple[Array, Array]:
    if rng.random() < 0.5:  # concentric rings
        cy, cx = rng.uniform(-0.2, 1.2, 2)
        t = np.hypot(yy - cy, xx - cx) * rng.uniform(8, 20)
    else:  # crossing sine waves
        u, w = _rotated(rng, yy, xx)
        t = u * rng.uniform(6, 14) + 0.6 * np.sin(w * rng.uniform(8, 20))
    v = np.floor((np.sin(t) * 0.5 + 0.5) * n * 0.999)
    return v, np.ones_like(v)


_TEXTURES = {
    "stripes": _tex_stripes,
    "dots": _tex_dots,
    "noise": _tex_noise,
    "brush": _tex_brush,
    "checker": _tex_checker,
    "waves": _tex_waves,
}


def make_style(rng: np.random.Generator, size: int, kind: str | None = None) -> Style:
    """A palette and the texture image painted with it."""
    kind = kind or STYLE_KINDS[rng.integers(len(STYLE_KINDS))]
    if kind not in _TEXTURES:
        raise ValueError(f"style kind must be one of {STYLE_KINDS}, not {kind!r}")
    palette = make_palette(rng)
    n = len(palette)
    yy, xx = _grid(size)
    v, shade = _TEXTURES[kind](rng, n, yy, xx, size)
    v = np.clip(v, 0, n - 1)
    lo = np.floor(v).astype(np.int64)
    hi = np.minimum(lo + 1, n - 1)
    frac = (v - lo)[..., None]
    img = palette[lo] * (1.0 - frac) + palette[hi] * frac
    grain = 1.0 + 0.08 * (_value_noise(rng, size, max(4, size // 6)) - 0.5)
    img = img * (shade * grain)[..., None]
    return Style(palette=palette, image=np.clip(img, 0.0, 255.0))
