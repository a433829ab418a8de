"""Real pictures that install by name from package registries, sorted into content photographs and styles.

The Debian packages below are downloaded (not installed) and unpacked into the cache; the chosen files go to
`DIR/contents` and `DIR/styles`, each with a `SOURCES.json` (package, path, copyright holder, licence). The
held-out pictures that judge the demo model (`heldout` below) never train or tune it.
"""
from __future__ import annotations

import fnmatch
import json
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

from data_tools.qt_resources import RccError, read_rcc
from stylevar.cli.command import Parser


@dataclass(frozen=True)
class Package:
    name: str
    folder: str                  # where its pictures lie inside the package
    contents: tuple[str, ...]    # glob patterns (file names) of photographs
    styles: tuple[str, ...]      # glob patterns of style pictures
    licence: str = ""            # package-wide statement when debian/copyright is not machine-readable
    heldout: tuple[str, ...] = field(default=())
    bundles: tuple[str, ...] = ()  # Qt resource bundles in `folder` whose files are the pictures (paths inside)
    exclude: tuple[str, ...] = ()  # glob patterns never taken (another set's pictures)


MATE = "usr/share/backgrounds/mate"
PACKAGES = (
    Package("mate-backgrounds", MATE,
            contents=("nature/*.jpg",),
            styles=("abstract/Elephants.jpg", "abstract/Flow.png", "abstract/Gulp.png", "desktop/Float-into-MATE.png")),
    Package("lomiri-wallpapers-16.04", "usr/share/backgrounds",
            contents=("Bridge_*", "Dragonfly_*", "Wine_*", "aitzgorri_*", "friends_*", "life_*", "picosdeeuropa_*",
                      "seeding_*", "sunset_*", "free_*", "Picture_0B_*", "Picture_1A_*"),
            styles=("analogpattern_*", "greentock_*", "umang_*")),
    Package("lomiri-wallpapers-20.04", "usr/share/backgrounds",
            contents=("Kleiber_*",), styles=("Fossa_*", "Infinite-Sea_*", "Painting-Colors_*")),
    Package("gnome-backgrounds", "usr/share/backgrounds/gnome", contents=(),
            styles=("pixels-l.webp", "wood-d.webp", "truchet-l.webp", "truchet-d.webp", "adwaita-d.webp",
                    "licorice-l.webp", "grid-d.webp", "grid-l.webp", "wood-l.webp"),
            licence="CC-BY-SA-3.0 or GPL-2+ (Jakub Steiner and the GNOME artists; see the package's copyright file)"),
    Package("propaganda-debian", "usr/share/wallpapers", contents=(), styles=("*.JPG",),
            licence="GPL-2+ (1998-2000 Bowie J. Poag, Naru Sundar / PROPAGANDA; see the package's copyright file)"),
)

GCOMPRIS = "usr/share/gcompris-qt/rcc"
FLARE = "usr/share/games/flare/mods"
# GCompris's photographs and public-domain paintings (licences in its copyright file), less those that judge the
# demo model (PAINTED below)
PAINTED_PHOTOS = ("*/explore_world_animals/resource/animals/*.webp",
                  *(f"*/details/*/{n}_background.webp" for n in ("Neuschwanstein", "Nagoya", "EilanDonanCastle",
                                                                "TajMahal", "TowerBridgeLondon", "OperaSidney",
                                                                "Chenonceau", "EgeskovSlotSpejling", "GizahPyramids",
                                                                "NDP", "FanoeWindmill")))
PAINTED_ART = tuple(f"*/details/*/{n}_background.webp" for n in ("Gogh4", "PortraitOfPereTanguy",
                                                                  "Van_Gogh_The_Night_Cafe"))
PAINTED_GAME_ART = ("*/menus/backgrounds/*.png",)
# training photographs of the same monuments as judges (other files, nearly the same views): left out too
PAINTED_LOOKALIKES = tuple(f"*/explore_monuments/*/{n}.webp" for n in ("neuschwansteinCastle", "tajMahal",
                                                                       "chateaudeChenonceau"))
PACKAGES += (
    Package("gcompris-qt-data", GCOMPRIS,
            bundles=("erase.rcc", "explore_monuments.rcc", "explore_farm_animals.rcc", "clickgame.rcc",
                     "details.rcc", "paintings.rcc"),
            contents=("*/erase/resource/*.webp", "*/explore_monuments/resource/*/*.webp",
                      "*/explore_farm_animals/resource/animals/*.webp", "*/clickgame/resource/sea*.webp"),
            styles=("*/details/*/*Gogh*_background.webp", "*/details/*/Eglise_dAuvers-sur-Oise_background.webp",
                    *(f"*/paintings/*/{n}_[135].webp" for n in ("gogh_auvert", "cassat_summertime", "bazille_rampart"))),
            exclude=PAINTED_PHOTOS + PAINTED_ART + PAINTED_LOOKALIKES),
    Package("flare-game", FLARE, contents=(), styles=("*/portraits/female0[1-4].png", "*/portraits/male0[1-4].png"),
            licence="CC-BY-SA-3.0 (Clint Bellanger and the Flare artists; see the package's copyright file)",
            exclude=PAINTED_GAME_ART),
)
# photographs x paintings that judge how much of a painting the demo model paints (never trained or tuned on)
PAINTED = (
    Package("gcompris-qt-data", GCOMPRIS, bundles=("explore_world_animals.rcc", "details.rcc"),
            contents=PAINTED_PHOTOS, styles=PAINTED_ART),
    Package("flare-game", FLARE, contents=(), styles=PAINTED_GAME_ART,
            licence="CC-BY-SA-3.0 (Clint Bellanger and the Flare artists; see the package's copyright file)"),
)

HELD_OUT = (  # judge the demo model only; never train or tune on them
    Package("plasma-workspace-wallpapers", "usr/share/wallpapers", contents=(), styles=(),
            licence="see the package's copyright file"),
    Package("ukui-wallpapers", "usr/share/backgrounds", contents=(), styles=(),
            licence="see the package's copyright file"),
)

SKIMAGE_PHOTOS = {  # file in skimage/data: (author / source, licence as scikit-image states it)
    "astronaut.png": ("NASA (Eileen Collins)", "public domain"),
    "chelsea.png": ("Stefan van der Walt", "CC0"),
    "coffee.png": ("Rachel Michetti", "CC0"),
    "rocket.jpg": ("SpaceX", "CC0"),
    "motorcycle_left.png": ("Middlebury stereo data set (Scharstein et al.)", "free use with citation"),
}
SKIMAGE_STYLES = {
    "brick.png": ("scikit-image (Stefan van der Walt)", "CC0"),
    "grass.png": ("scikit-image (Stefan van der Walt)", "CC0"),
    "gravel.png": ("scikit-image (Stefan van der Walt)", "CC0"),
}


def dep5_licences(copyright_text: str) -> list[tuple[list[str], str, str]]:
    """(file patterns, copyright holder, licence) per stanza of a machine-readable debian/copyright."""
    stanzas = []
    for block in copyright_text.split("\n\n"):
        fields: dict[str, str] = {}
        key = None
        for line in block.splitlines():
            if line[:1] in (" ", "\t") and key:
                fields[key] += "\n" + line.strip()
            elif ":" in line:
                key, _, value = line.partition(":")
                fields[key] = value.strip()
        if "Files" in fields and "License" in fields:
            stanzas.append((fields["Files"].split(), fields.get("Copyright", "").replace("\n", "; "),
                            fields["License"].splitlines()[0]))
    return stanzas


def licence_of(relpath: str, stanzas: list[tuple[list[str], str, str]], fallback: str) -> dict:
    """The last matching stanza wins, as the copyright format specifies."""
    found = {"copyright": "", "licence": fallback}
    for patterns, holder, licence in stanzas:
        if any(fnmatch.fnmatch(relpath, p) or relpath.endswith("/" + p) or Path(relpath).name == p for p in patterns):
            found = {"copyright": holder, "licence": licence}
    return found


def largest_per_picture(base: Path, files: list[Path]) -> list[Path]:
    """One file per picture: of a wallpaper folder's several sizes, the largest; loose files stand alone."""
    best: dict[str, Path] = {}
    for f in files:
        rel = f.relative_to(base)
        if "screenshot" in f.name or f.suffix.lower() not in (".jpg", ".jpeg", ".png", ".webp"):
            continue
        key = rel.parts[0] if len(rel.parts) > 1 else rel.name
        if key not in best or f.stat().st_size > best[key].stat().st_size:
            best[key] = f
    return sorted(best.values())


def unpack(package: str, cache: Path) -> Path:
    """apt-get download + dpkg-deb -x into cache/<package>; reused when already there."""
    root = cache / package
    if (root / ".unpacked").exists():
        return root
    debs = cache / "debs"
    debs.mkdir(parents=True, exist_ok=True)
    subprocess.run(["apt-get", "download", package], cwd=debs, check=True, capture_output=True)
    deb = max(debs.glob(f"{package}_*.deb"), key=lambda p: p.stat().st_mtime)
    root.mkdir(parents=True, exist_ok=True)
    subprocess.run(["dpkg-deb", "-x", str(deb), str(root)], check=True)
    (root / ".unpacked").touch()
    return root


def _copy(src: Path, dest_dir: Path, name: str, record: dict, sources: dict) -> None:
    dest_dir.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(src, dest_dir / name)
    sources[name] = record


SETS = {"train": PACKAGES, "heldout": HELD_OUT, "painted": PAINTED}


def unpack_bundles(root: Path, pkg: Package) -> Path:
    """The files of the package's Qt resource bundles, written once under root/rcc; that folder."""
    out = root / "rcc"
    done = out / f".{'+'.join(pkg.bundles)}"
    if not done.exists():
        for bundle in pkg.bundles:
            for inner, data in read_rcc(root / pkg.folder / bundle).items():
                dest = out / inner
                dest.parent.mkdir(parents=True, exist_ok=True)
                dest.write_bytes(data)
        done.touch()
    return out


def _licence_path(pkg: Package, rel: str) -> str:
    # a bundle's files are named in debian/copyright by their source path (src/activities/...)
    return rel.split("/", 1)[1] if pkg.bundles and "/" in rel else rel


def collect(out: Path, cache: Path, which: str = "train") -> dict[str, int]:
    """Copy the set's pictures into out/contents and out/styles ("heldout": every picture into contents)."""
    flat = which == "heldout"
    sources: dict[str, dict] = {"contents": {}, "styles": {}}
    for pkg in SETS[which]:
        root = unpack(pkg.name, cache)
        copyright_files = list((root / "usr/share/doc").glob("*/copyright"))
        text = copyright_files[0].read_text(encoding="utf-8", errors="replace") if copyright_files else ""
        stanzas = dep5_licences(text) if text.startswith("Format:") else []
        base = unpack_bundles(root, pkg) if pkg.bundles else root / pkg.folder
        files = sorted(p for p in base.rglob("*") if p.is_file() and not p.name.startswith("."))
        if flat:
            files = largest_per_picture(base, files)
        for role, patterns in (("contents", pkg.contents), ("styles", pkg.styles)):
            if flat:
                patterns = ("*.jpg", "*.jpeg", "*.png", "*.webp")
                role = "contents"
            for f in files:
                rel = f.relative_to(base).as_posix()
                if not _matches(rel, patterns) or _matches(rel, pkg.exclude):
                    continue
                where = f"/{pkg.folder}/{'+'.join(pkg.bundles)}:{rel}" if pkg.bundles else f"/{pkg.folder}/{rel}"
                record = {"package": pkg.name, "path": where,
                          **licence_of(_licence_path(pkg, rel), stanzas,
                                       pkg.licence or "see the package's copyright file")}
                _copy(f, out / role, f"{pkg.name}--{rel.replace('/', '--')}", record, sources[role])
            if flat:
                break
    if which == "train":
        _add_skimage(out, sources)
    for role, recs in sources.items():
        if recs:
            (out / role / "SOURCES.json").write_text(json.dumps(recs, indent=1, ensure_ascii=False) + "\n")
    return {role: len(recs) for role, recs in sources.items()}


def _matches(rel: str, patterns: tuple[str, ...]) -> bool:
    return any(fnmatch.fnmatch(rel, p) or fnmatch.fnmatch(rel.rsplit("/", 1)[-1], p) for p in patterns)


def _add_skimage(out: Path, sources: dict) -> None:
    try:
        import skimage
    except ModuleNotFoundError:
        print("[pictures] scikit-image is not importable: its sample photographs are left out", file=sys.stderr)
        return
    data = Path(skimage.__file__).parent / "data"
    for role, table in (("contents", SKIMAGE_PHOTOS), ("styles", SKIMAGE_STYLES)):
        for name, (author, licence) in table.items():
            if (data / name).is_file():
                record = {"package": f"scikit-image {skimage.__version__} (PyPI)", "path": f"skimage/data/{name}",
                          "copyright": author, "licence": licence}
                _copy(data / name, out / role, f"skimage--{name}", record, sources[role])


def main(argv: list[str] | None = None) -> int:
    p = Parser(prog="python -m data_tools.pictures", description=__doc__.split("\n\n")[0])
    p.add_argument("--out", type=Path, required=True, help="writes OUT/contents and OUT/styles")
    p.add_argument("--cache", type=Path, default=None, help="where packages are downloaded (default: OUT/.cache)")
    p.add_argument("--held-out", action="store_true",
                   help="collect the held-out judging pictures instead (into OUT/contents; used as both roles)")
    p.add_argument("--painted", action="store_true",
                   help="collect the held-out photographs x paintings instead (OUT/contents, OUT/styles)")
    a = p.parse_args(argv)
    which = "heldout" if a.held_out else "painted" if a.painted else "train"
    try:
        counts = collect(a.out, a.cache or a.out / ".cache", which)
    except (subprocess.CalledProcessError, OSError, RccError) as e:
        print(f"pictures: {e}", file=sys.stderr)
        return 2
    print(f"[pictures] {counts} into {a.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
