"""Word lists for the writing rewards: English stop words and transition words by category.

Transition phrases are matched as whole words, case-insensitively (``"so"`` does not match "also").
The twelve categories are those of the published tldr/arxiv style reward.
"""

from __future__ import annotations

STOPWORDS: frozenset[str] = frozenset(
    """
    a about above after again against all also am an and any are aren't as at be because been before being
    below between both but by can cannot could couldn't did didn't do does doesn't doing don't down during each
    few for from further had hadn't has hasn't have haven't having he he'd he'll he's her here here's hers herself
    him himself his how how's i i'd i'll i'm i've if in into is isn't it it's its itself just let's me more most
    mustn't my myself no nor not now of off on once only or other ought our ours ourselves out over own same
    shan't she she'd she'll she's should shouldn't so some such than that that's the their theirs them themselves
    then there there's these they they'd they'll they're they've this those through to too under until up very
    was wasn't we we'd we'll we're we've were weren't what what's when when's where where's which while who who's
    whom why why's will with won't would wouldn't you you'd you'll you're you've your yours yourself yourselves
    s t d ll m re ve
    """.split()
)

# fmt: off
TRANSITIONS: dict[str, tuple[str, ...]] = {
    "elaboration": (
        "furthermore", "moreover", "additionally", "in addition", "besides", "what is more", "not only",
        "as well as", "along with", "also", "further", "beyond that",
    ),
    "example": (
        "for example", "for instance", "such as", "including", "namely", "to illustrate", "in particular",
        "specifically", "as an illustration", "e.g.",
    ),
    "explanation": (
        "that is", "in other words", "to put it simply", "to clarify", "put differently", "this means",
        "which means", "i.e.", "simply put", "in fact",
    ),
    "cause_effect": (
        "therefore", "thus", "consequently", "as a result", "hence", "accordingly", "because", "since",
        "due to", "so that", "for this reason", "leads to", "resulting in", "as a consequence",
    ),
    "contrast": (
        "however", "on the other hand", "in contrast", "by contrast", "conversely", "instead", "whereas",
        "but", "yet", "on the contrary", "rather", "unlike",
    ),
    "sequence": (
        "first", "firstly", "second", "secondly", "third", "next", "then", "finally", "lastly",
        "subsequently", "afterwards", "to begin with", "initially",
    ),
    "emphasis": (
        "indeed", "certainly", "especially", "above all", "most importantly", "notably", "clearly",
        "undoubtedly", "significantly", "particularly", "of course",
    ),
    "summary": (
        "in summary", "in conclusion", "to summarize", "to sum up", "overall", "in short", "in brief",
        "all in all", "ultimately", "in the end", "on the whole",
    ),
    "comparison": (
        "similarly", "likewise", "in the same way", "equally", "just as", "compared to", "compared with",
        "in comparison", "by the same token",
    ),
    "concession": (
        "although", "though", "even though", "despite", "in spite of", "nevertheless", "nonetheless",
        "admittedly", "even so", "regardless", "granted",
    ),
    "condition": (
        "if", "unless", "provided that", "as long as", "in case", "otherwise", "even if", "only if",
        "assuming that", "given that",
    ),
    "time": (
        "meanwhile", "while", "when", "after", "before", "during", "until", "eventually", "later",
        "previously", "currently", "at the same time", "recently", "now",
    ),
}
# fmt: on
