"""The target id that carries no loss, shared by the data that marks targets and the tasks that score them."""

IGNORE = -100  # a target with no loss: not <pad>, which may be a real token too (GPT-2 pads with <eos>)
