"""Write the shipped demo dataset: data/demo.biom (HDF5) + data/demo.nwk, from the synthetic generator.

    python scripts/make_demo_data.py [--out data] [--samples 40] [--richness-scale 128] [--seed 7]
"""

import argparse
from pathlib import Path

from debug_nan.aam.data.synthetic import synthesize
from debug_nan.aam.data.writing import write_biom, write_tree


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", default="data")
    ap.add_argument("--samples", type=int, default=40)
    ap.add_argument("--richness-scale", type=int, default=128, help="richness spans scale/8 .. 2 x scale")
    ap.add_argument("--seed", type=int, default=7)
    args = ap.parse_args()
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    data = synthesize(args.samples, args.richness_scale, args.seed)
    table, tree = write_biom(data, out / "demo.biom"), write_tree(data, out / "demo.nwk")
    for p in (table, tree):
        print(f"wrote {p} ({p.stat().st_size / 1024:.0f} KiB)")


if __name__ == "__main__":
    main()
