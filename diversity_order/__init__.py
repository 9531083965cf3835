"""diversity-order: reorder LLM training data so every packed sequence is topically diverse.

Data flows one way: records -> token ids -> embeddings -> labels -> order -> stats/outputs.
Per-document state is kept as flat arrays indexed by input position so every stage can run
on a slice of the input.
"""

__version__ = "0.1.0"
