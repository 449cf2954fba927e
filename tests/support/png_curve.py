#!/usr/bin/env python3
"""Where a colour lies in a PNG, for tests/integration/plot_spec.lua: it renders
a plot in headless Chromium and checks that the picture holds the curve.

  png_curve.py PNG X0 Y0 X1 Y1 RRGGBB [RRGGBB ...]

X0 Y0 X1 Y1 is the plot area (the SVG's frame). Prints key=value lines:
  size W H                the picture's size in pixels
  nonwhite N              pixels of the whole picture that are not white
and for each colour (pixels within TOLERANCE of it in every channel, inside the plot area):
  RRGGBB pixels N bands B first R last R
    B: how many of BANDS equal column bands hold such a pixel; R: the mean
    row of those pixels in the first and in the last band (-1: none there).
Needs Pillow (Debian: python3-pil).
"""
import sys

from PIL import Image

BANDS = 10      # column bands of the plot area
TOLERANCE = 48  # largest difference per channel that still counts as the colour (antialiasing)


def main(argv):
    if len(argv) < 7:
        sys.exit(__doc__)
    img = Image.open(argv[1]).convert("RGB")
    x0, y0, x1, y1 = (int(round(float(v))) for v in argv[2:6])
    w, h = img.size
    px = img.load()
    print("size", w, h)
    print("nonwhite", sum(1 for y in range(h) for x in range(w) if px[x, y] != (255, 255, 255)))
    x0, x1, y0, y1 = max(x0, 0), min(x1, w - 1), max(y0, 0), min(y1, h - 1)
    for hexc in argv[6:]:
        want = tuple(int(hexc[i:i + 2], 16) for i in (0, 2, 4))
        rows = [[] for _ in range(BANDS)]
        for y in range(y0, y1 + 1):
            for x in range(x0, x1 + 1):
                if all(abs(a - b) <= TOLERANCE for a, b in zip(px[x, y], want)):
                    rows[min(BANDS - 1, (x - x0) * BANDS // (x1 - x0 + 1))].append(y)
        def mean(r):
            return sum(r) / len(r) if r else -1
        print(hexc, "pixels", sum(len(r) for r in rows), "bands", sum(1 for r in rows if r),
              "first", round(mean(rows[0]), 1), "last", round(mean(rows[-1]), 1))


if __name__ == "__main__":
    main(sys.argv)
