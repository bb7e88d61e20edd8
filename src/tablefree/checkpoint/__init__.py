"""The checkpoint and model-directory format: the one owner of its file names, markers, writing and reading.

A model directory (what ``tablefree eval``, ``export``, ``generate`` and ``analyze`` read)::

    step_00000100/
        model.safetensors   # weights and the fixed interfaces' persistent buffers (A and b for affine)
        config.json         # {"model": ModelConfig as a dict, "train": the resolved TrainConfig (training only)}
        tokenizer.json      # the tokenizer the model was trained with (when known)
        meta.json           # step, tokens_seen, tokenizer_hash, data_dir, interface, seed, losses
        COMPLETE            # written last: {"complete": true, "sha256": {file: digest, ...}}

A training checkpoint adds ``train_state.pt`` (``TrainState``, optimizer keyed by parameter name, RNG states,
loader position). A sharded one (FSDP2, ``checkpoint_format: sharded``) holds ``sharded/`` (DCP: model and
optimizer, one file per rank) instead of ``model.safetensors`` and the optimizer. A run keeps them under
``RUN/checkpoints/``.

- ``layout``: the names, the markers and finding checkpoints (no torch);
- ``model_dir``: model files, written and read; ``load_model`` is the one way inference reads weights;
- ``sharded``: the DCP part of a sharded checkpoint;
- ``training``: a training checkpoint whole: save, ``train_state.pt``, checks, restore, pruning;
- ``verify``: the checks every reader runs before using a checkpoint (digests, JSON, the weights header
  against the config before allocation, finite weights).

Nothing here imports ``tablefree.train``: evaluation, export, report and analysis read checkpoints through this
package alone.
"""
