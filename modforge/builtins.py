"""The one place where built-in components are registered (imported by registry.load_builtins)."""
import modforge.components.activations  # noqa: F401
import modforge.components.attention  # noqa: F401
import modforge.components.ffn  # noqa: F401
import modforge.components.norms  # noqa: F401
import modforge.components.positions  # noqa: F401
import modforge.components.residual  # noqa: F401
import modforge.data.lm  # noqa: F401
import modforge.data.seq2seq  # noqa: F401
import modforge.data.tokenizers  # noqa: F401
import modforge.models.architectures  # noqa: F401
import modforge.optim  # noqa: F401
import modforge.tasks.lm  # noqa: F401
import modforge.tasks.seq2seq  # noqa: F401
import modforge.data.classify  # noqa: F401
import modforge.data.parallel  # noqa: F401
import modforge.tasks.classify  # noqa: F401
import modforge.trainer_schema  # noqa: F401  (the trainer group's schema, not a component)
