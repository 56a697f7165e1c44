"""A small text corpus made on the spot, so training needs no network and no data files.

Sentences come from a seeded little grammar (subjects, verbs, objects, places, times) with
random choices at every slot, so a character-level model learns the words and the grammar
quickly but cannot predict the choices: the loss has a floor well above zero, which is what a
comparison of optimizers needs (DESIGN.md section 3's training bar).
"""

import random

_SUBJECTS = ["the cat", "a dog", "my friend", "the old man", "our teacher", "the bird",
             "a child", "the farmer", "her sister", "the captain", "a stranger", "the baker"]
_VERBS = ["sees", "finds", "likes", "carries", "watches", "paints", "follows", "helps",
          "greets", "draws", "calls", "meets"]
_OBJECTS = ["a red ball", "the small boat", "an apple", "the blue door", "a letter",
            "the long road", "some bread", "a green hat", "the river", "a wooden box"]
_PLACES = ["in the garden", "near the house", "by the sea", "at the market", "on the hill",
           "under the tree", "in the town", "at the station"]
_TIMES = ["today", "every morning", "at night", "in the spring", "after lunch", "once"]


def sentence(rng):
    parts = [rng.choice(_SUBJECTS), rng.choice(_VERBS), rng.choice(_OBJECTS)]
    if rng.random() < 0.6:
        parts.append(rng.choice(_PLACES))
    if rng.random() < 0.4:
        parts.append(rng.choice(_TIMES))
    return " ".join(parts) + "."


def make_corpus(chars, seed=0):
    """About `chars` characters of sentences, one per line."""
    rng = random.Random(seed)
    lines, total = [], 0
    while total < chars:
        lines.append(sentence(rng))
        total += len(lines[-1]) + 1
    return "\n".join(lines) + "\n"


def vocabulary():
    """Every character the grammar can produce, in a fixed order."""
    words = _SUBJECTS + _VERBS + _OBJECTS + _PLACES + _TIMES
    return sorted(set("".join(words) + " .\n"))
