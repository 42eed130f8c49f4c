"""modforge's own kinds, as data."""
from modforge.registry.core import _REGISTRIES, Kind, Registry

# modforge's own kinds, in their order (of the config groups and their defaults, `python -m modforge list`,
# config.yaml and metrics.json): declared here as data, so that no order of imports decides it; each base class
# lives with the kind's options and is named, not imported (this floor imports nothing above it)
KINDS = (
    Kind("model", "architecture (and, through it, its default task)", "modforge.models.architectures:Model",
         default="decoder_only"),
    Kind("task", "training objective (a LightningModule) and its default data (chosen by the model unless given)",
         "modforge.tasks.base:Task"),
    Kind("tokenizer", "text <-> token ids", "modforge.data.tokenizers.base:Tokenizer", nested_in="data.tokenizer"),
    Kind("data", "dataset / datamodule (chosen by the task unless given)", "modforge.data.base:DataModule"),
    Kind("norm", "normalisation layer (called as norm(x, mask))", "modforge.components.norms:Norm", default="layer",
         part=True),
    Kind("residual", "where the norm sits around each sub-layer", "modforge.components.residual:Residual",
         default="pre", part=True),
    Kind("ffn", "position-wise feed-forward block", "modforge.components.ffn:FFN", default="gelu", part=True),
    Kind("activation", "element-wise non-linearity used by FFNs", "modforge.components.activations:Activation",
         nested_in="ffn.activation"),
    Kind("pos", "positional scheme (embedding, rotation or attention bias)",
         "modforge.components.positions:PositionalScheme", default="learned", part=True),
    Kind("attention", "attention (self and cross) and its decoding cache", "modforge.components.attention:Attention",
         default="mha", part=True),
    Kind("logits", "what the head's scores become, for the loss and for sampling", "modforge.components.logits:Logits",
         default="plain", part=True),
    Kind("optim", "optimizer: a function (cfg, params) -> torch.optim.Optimizer", default="adamw"),
    Kind("scheduler", "learning-rate schedule: a function (cfg, optimizer, *, d_model, total_steps) -> LR scheduler",
         default="cosine"),
    Kind("param", "parametrisation: how init, learning rates and multipliers scale with the model's size",
         "modforge.models.param:Parametrisation", default="standard"),
)


for _kind in KINDS:  # modforge's own kinds, before anything registers (a plugin declares its own: declare())
    _REGISTRIES[_kind.name] = Registry(_kind)
