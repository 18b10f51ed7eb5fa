"""Flickr30k Entities (Plummer et al., ICCV 2015): noun phrases of the captions linked to boxes, per Flickr id.

``Sentences/<id>.txt``: a caption a line, phrases marked ``[/EN#<chain>/<type> words]`` (chain 0: not visual).
``Annotations/<id>.xml``: the original photo's ``<size>`` and ``<object>``s naming chains, each with a ``<bndbox>``
(1-based pixels: pixel p covers [p - 1, p]) or ``<nobndbox>`` / ``<scene>``. A phrase is grounded when its chain has
a box. Errors name the file and what is wrong.
"""

from __future__ import annotations

import re
import xml.etree.ElementTree as ET
from dataclasses import dataclass, field
from pathlib import Path

from ..errors import DataError

TYPES = ("people", "clothing", "bodyparts", "animals", "vehicles", "instruments", "scene", "other")

_PHRASE = re.compile(r"\[/EN#(\d+)((?:/[^\s/\]]+)+)\s+([^\]]*)\]")


@dataclass(frozen=True)
class Phrase:
    text: str  # the phrase's words, as in the caption
    chain: str  # the coreference chain id ("0": not visual)
    types: tuple[str, ...]  # Entities types, e.g. ("people",)
    start: int  # character span of the phrase in the plain caption
    end: int


@dataclass(frozen=True)
class Sentence:
    text: str  # the caption without the markup (words joined by single spaces)
    phrases: tuple[Phrase, ...]


@dataclass
class Annotation:
    width: int
    height: int
    boxes: dict[str, list[tuple[float, float, float, float]]] = field(default_factory=dict)  # chain -> boxes
    nobox: set[str] = field(default_factory=set)  # chains flagged nobndbox
    scene: set[str] = field(default_factory=set)  # chains flagged scene


def parse_sentence(line: str, where: str = "sentence") -> Sentence:
    """One marked caption -> the plain text and its phrases with their character spans in it."""
    words: list[str] = []
    phrases: list[Phrase] = []
    pos = 0
    length = 0  # characters of the plain text so far

    def add(text: str) -> None:
        nonlocal length
        for w in text.split():
            if words:
                length += 1
            words.append(w)
            length += len(w)

    for m in _PHRASE.finditer(line):
        add(line[pos:m.start()])
        inner = m.group(3).split()
        if not inner:
            raise DataError(where, f"an empty phrase at character {m.start()}")
        start = length + (1 if words else 0)
        add(m.group(3))
        types = tuple(t for t in m.group(2).split("/") if t)
        phrases.append(Phrase(" ".join(inner), m.group(1), types, start, length))
        pos = m.end()
    rest = line[pos:]
    if "[/EN#" in rest:
        raise DataError(where, f"a malformed phrase mark at character {pos + rest.index('[/EN#')}")
    add(rest)
    return Sentence(" ".join(words), tuple(phrases))


def read_sentences(path) -> list[Sentence]:
    """The captions of one ``Sentences/<id>.txt`` file, in order."""
    path = Path(path)
    try:
        text = path.read_bytes().decode("utf-8")
    except FileNotFoundError:
        raise DataError(path, "Entities sentence file not found") from None
    except UnicodeDecodeError as e:
        raise DataError(path, f"not valid UTF-8 ({e.reason} at byte {e.start})") from None
    lines = [ln for ln in text.splitlines() if ln.strip()]
    return [parse_sentence(ln.strip(), f"{path}: line {no}") for no, ln in enumerate(lines, start=1)]


def _int(node, tag: str, path) -> int:
    el = node.find(tag)
    try:
        return int(float(el.text))
    except (AttributeError, TypeError, ValueError):
        raise DataError(path, f"<{tag}> is missing or not a number") from None


def read_annotation(path) -> Annotation:
    """The photo size and each chain's boxes of one ``Annotations/<id>.xml`` file."""
    path = Path(path)
    try:
        root = ET.parse(path).getroot()
    except FileNotFoundError:
        raise DataError(path, "Entities annotation file not found") from None
    except ET.ParseError as e:
        raise DataError(path, f"not well-formed XML ({e})") from None
    size = root.find("size")
    if size is None:
        raise DataError(path, "no <size> element")
    ann = Annotation(_int(size, "width", path), _int(size, "height", path))
    if ann.width <= 0 or ann.height <= 0:
        raise DataError(path, f"photo size {ann.width} x {ann.height} is not positive")
    for obj in root.iter("object"):
        chains = [n.text.strip() for n in obj.findall("name") if n.text and n.text.strip()]
        box = obj.find("bndbox")
        if box is not None:
            x1, y1, x2, y2 = (_int(box, t, path) for t in ("xmin", "ymin", "xmax", "ymax"))
            if x2 < x1 or y2 < y1:
                raise DataError(path, f"box ({x1}, {y1}, {x2}, {y2}) of chain {chains} has negative size")
            for c in chains:
                ann.boxes.setdefault(c, []).append((float(x1), float(y1), float(x2), float(y2)))
        if obj.find("nobndbox") is not None and (obj.findtext("nobndbox") or "").strip() == "1":
            ann.nobox.update(chains)
        if obj.find("scene") is not None and (obj.findtext("scene") or "").strip() == "1":
            ann.scene.update(chains)
    return ann


def photo_id(filename: str) -> str:
    """The Flickr id of an image file name: ``1000268201_693b08cb0e.jpg`` -> ``1000268201``."""
    stem = Path(filename).name.rsplit(".", 1)[0]
    return stem.split("_", 1)[0]


def in_box(x: float, y: float, box: tuple[float, float, float, float]) -> bool:
    """Whether the point (x, y), in the photo's continuous pixel coordinates, is inside a 1-based inclusive box."""
    x1, y1, x2, y2 = box
    return x1 - 1 <= x <= x2 and y1 - 1 <= y <= y2


@dataclass(frozen=True)
class GroundedPhrase:
    caption: int  # index of the caption among the photo's sentences
    phrase: Phrase
    boxes: tuple[tuple[float, float, float, float], ...]


class EntitiesDir:
    """A folder holding ``Annotations/`` and ``Sentences/`` in the Flickr30k Entities format."""

    def __init__(self, root):
        self.root = Path(root).expanduser()
        for sub in ("Annotations", "Sentences"):
            if not (self.root / sub).is_dir():
                raise DataError(self.root, f"no {sub}/ folder: an Entities folder holds Annotations/ and Sentences/")

    def has(self, filename: str) -> bool:
        pid = photo_id(filename)
        return (self.root / "Sentences" / f"{pid}.txt").is_file() and (self.root / "Annotations" / f"{pid}.xml").is_file()

    def load(self, filename: str) -> tuple[list[Sentence], Annotation]:
        pid = photo_id(filename)
        return read_sentences(self.root / "Sentences" / f"{pid}.txt"), read_annotation(self.root / "Annotations" / f"{pid}.xml")

    def grounded(self, filename: str) -> tuple[list[Sentence], Annotation, list[GroundedPhrase]]:
        """The photo's captions, annotation and every phrase whose chain has at least one box."""
        sentences, ann = self.load(filename)
        out = [GroundedPhrase(i, p, tuple(ann.boxes[p.chain])) for i, s in enumerate(sentences)
               for p in s.phrases if p.chain != "0" and ann.boxes.get(p.chain)]
        return sentences, ann, out
