"""diversity-order: reorder training data so every packed training sequence is topically diverse.

Data flows one way; each stage is one module (the scripts only parse flags and call them):

    sources       every input format as one kind of source (--input files, folders, globs)
      records       JSONL records -> a byte-offset index and fingerprints; text batches; byte-exact writer
      arrow_sources Parquet files and datasets folders (save_to_disk), read a row group at a time
      fields        which part of a record is the document: dotted paths, joined fields, conversations
    writers       the curated data in the input's format or converted, in --output-shards slices
    packed_export --export-packed: the curated order as ready training sequences with boundaries
    tokenizer     texts -> token ids                      embedding_table  the model's input-embedding table
    embed         ids -> shallow embeddings (mean pooled) features  counts + embeddings, cached (caches)
    clustering    embeddings -> PCA, k-means labels, k calibration
    orderings/    labels + token counts -> a permutation (one module per family, one registry)
    packing       the trainer's packing rule (documents whole or split), shared by orderings and measures
    diversity     the measures: unique clusters per window, token-share uniformity, boundary shift, coverage
    ordering_report  --compare-strategies: every ordering measured on the user's data
    curate        the curate pipeline, stage by stage      deep/  extract_deep_embeddings (last-layer means)
    scale_out     curate under torchrun: shared cache file, sampled k-means fit, only labels + counts to rank 0
    kept_rows     what ranks stopped part-way (Ctrl-C, SIGTERM) had embedded, taken up by the next run
    plots, projection  the PNGs and the 2-D projection      animate  the videos
    cluster_compare  compare_clusterings (ARI/NMI, splits and merges)

Shared plumbing: runtime (device, torchrun start-up, stage timing, progress), distributed (torchrun
shares and gathers), atomic (atomic writes), arrays (checked .npy inputs), defaults, errors, cli.
"""
