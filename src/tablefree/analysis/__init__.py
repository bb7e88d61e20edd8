"""``tablefree analyze``: what the layers build from the input interface (issue 14).

Two ideas, one module each:

* **bit probes** (``probes``): is the current token's code readable from the residual state at layer ℓ of
  real text, on token types the probe never saw, beyond what the untrained model and random per-type labels
  give? Read by a linear probe, and on request by a small MLP probe (``mlp``), which can read XORs of code
  bits that a linear probe cannot (``probe_code_bits``, ``run.controlled_probes``)
* **effective embeddings** (``embeddings``): E_ℓ(t), the state after layer ℓ for token t alone, compared with a
  reference model's learned table (``linear_cka``, debiased, with its permutation null ``cka_null``, ``frequency_r2``, ``nearest_neighbours``, ``knn_overlap``).

``run_analysis(AnalyzeSpec(checkpoint, ...))`` does both for a checkpoint and writes ``analysis.json``, ``analysis.md`` and figures;
``analysis_markdown`` renders a result as a markdown section for other reports (``tablefree compare``).
"""

from tablefree.analysis.embeddings import frequency_r2, knn_overlap, nearest_neighbours, token_counts
from tablefree.analysis.linear import RidgeAccumulator, cka_null, fit_ridge, linear_cka
from tablefree.analysis.mlp import MLPProbeSettings, fit_mlp
from tablefree.analysis.probes import code_sets, fit_types, probe_code_bits, random_labels
from tablefree.analysis.render import analysis_markdown, write_analysis
from tablefree.analysis.run import run_analysis
from tablefree.analysis.spec import AnalyzeSpec
from tablefree.analysis.states import effective_embeddings, layer_states

__all__ = [
    "AnalyzeSpec",
    "MLPProbeSettings",
    "RidgeAccumulator",
    "analysis_markdown",
    "cka_null",
    "code_sets",
    "effective_embeddings",
    "fit_mlp",
    "fit_ridge",
    "fit_types",
    "frequency_r2",
    "knn_overlap",
    "layer_states",
    "linear_cka",
    "nearest_neighbours",
    "probe_code_bits",
    "random_labels",
    "run_analysis",
    "token_counts",
    "write_analysis",
]
