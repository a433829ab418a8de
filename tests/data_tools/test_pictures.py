"""data_tools.pictures' file patterns, checked without downloading anything: `_matches` and `exclude`, and that
no picture of the held-out photographs x paintings set (PAINTED) is taken by the training set (PACKAGES). The
example paths are the packages' own (GCompris's bundles as `data_tools.qt_resources` unpacks them, Flare's mods)."""
from __future__ import annotations

from data_tools.pictures import (PACKAGES, PAINTED, PAINTED_ART, PAINTED_GAME_ART, PAINTED_PHOTOS, SETS, Package,
                                 _matches)

DETAILS = "gcompris/src/activities/details/resource/image"
PAINTED_EXAMPLES = {
    "gcompris-qt-data": [f"gcompris/src/activities/explore_world_animals/resource/animals/{n}.webp"
                         for n in ("bison", "chameleon")]
                        + [f"{DETAILS}/{n}_background.webp" for n in ("Neuschwanstein", "TajMahal", "NDP", "Gogh4",
                                                                     "PortraitOfPereTanguy", "Van_Gogh_The_Night_Cafe")],
    "flare-game": [f"fantasycore/images/menus/backgrounds/{n}.png" for n in ("ice_palace", "fire_temple")],
}
TRAINING_EXAMPLES = {  # taken for training: photographs, paintings, portraits
    "gcompris-qt-data": ["gcompris/src/activities/explore_monuments/resource/india/charminar.webp",
                         f"{DETAILS}/VincentVanGoghBridge_background.webp",
                         f"{DETAILS}/Eglise_dAuvers-sur-Oise_background.webp"],
    "flare-game": ["fantasycore/images/portraits/female01.png", "fantasycore/images/portraits/male04.png"],
}


def _taken(pkg: Package, rel: str) -> bool:
    """What `collect` copies: a contents or styles pattern matches and no exclude pattern does."""
    return _matches(rel, pkg.contents + pkg.styles) and not _matches(rel, pkg.exclude)


def _training(name: str) -> list[Package]:
    return [p for p in PACKAGES if p.name == name]


def test_matches_the_whole_path_or_the_file_name():
    assert _matches("a/b/c.webp", ("*/b/*.webp",))
    assert _matches("a/b/c.webp", ("c.webp",))  # a pattern without a folder matches the file name
    assert not _matches("a/b/c.webp", ("*/x/*.webp", "d.webp"))
    assert _matches("a/b/male03.png", ("*/b/male0[1-4].png",)) and not _matches("a/b/male05.png", ("*/b/male0[1-4].png",))
    assert not _matches("a/b/c.webp", ())


def test_the_examples_are_what_each_set_takes():
    for name, paths in PAINTED_EXAMPLES.items():
        painted = [p for p in PAINTED if p.name == name]
        assert all(any(_matches(rel, p.contents + p.styles) for p in painted) for rel in paths), name
    for name, paths in TRAINING_EXAMPLES.items():
        assert all(any(_taken(p, rel) for p in _training(name)) for rel in paths), name


def test_no_painted_picture_is_a_training_picture():
    for name, paths in PAINTED_EXAMPLES.items():
        assert _training(name), name
        taken = [rel for rel in paths for p in _training(name) if _taken(p, rel)]
        assert not taken, f"{name}: the held-out pictures {taken} would be trained on"


def test_the_exclusions_are_what_keeps_them_apart():
    """Held-out Van Gogh paintings match the training styles' patterns: only `exclude` leaves them out; every
    held-out pattern is excluded, so a new training pattern cannot take them either."""
    gcompris, flare = _training("gcompris-qt-data")[0], _training("flare-game")[0]
    night_cafe = f"{DETAILS}/Van_Gogh_The_Night_Cafe_background.webp"
    assert _matches(night_cafe, gcompris.styles) and _matches(night_cafe, gcompris.exclude)
    menu = "fantasycore/images/menus/backgrounds/ice_palace.png"
    assert _matches(menu, PAINTED_GAME_ART) and _matches(menu, flare.exclude)
    assert set(PAINTED_PHOTOS + PAINTED_ART) <= set(gcompris.exclude)
    # every held-out pattern is excluded by the training package of the same name, whatever its files are called
    for painted in PAINTED:
        for pkg in _training(painted.name):
            assert set(painted.contents + painted.styles) <= set(pkg.exclude), painted.name


def test_the_sets():
    assert set(SETS) == {"train", "heldout", "painted"}
    assert SETS["train"] is PACKAGES and SETS["painted"] is PAINTED
