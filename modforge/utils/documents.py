"""Documents packed into one token sequence: which document each token is in, and its place in it (torch only).

A packed training window holds the ends of some documents and the starts of others, separated by an
end-of-document id ``eod``. Under the policy ``end`` (nanoGPT's OpenWebText, ``modforge prepare``'s default)
that id closes a document and belongs to it; under ``start`` (llm.c's and modded-nanogpt's FineWeb) it opens
the next one. A window's first token always starts a document (of what the window holds)."""
import torch

POLICIES = ("end", "start")


def document_ids(x: torch.Tensor, eod: int, policy: str = "end") -> tuple:
    """x (B, T) token ids -> (documents, positions), both (B, T) int64: each token's document number in its row
    (0, 1, ...) and its position inside that document (0 at the document's first token in the window)."""
    if policy not in POLICIES:
        raise ValueError(f"policy={policy!r}: one of {POLICIES}")
    B, T = x.shape
    is_eod = x == eod
    begins = torch.zeros_like(is_eod)
    begins[:, 0] = True
    if policy == "end":
        begins[:, 1:] |= is_eod[:, :-1]  # the token after an end-of-document starts the next
    else:
        begins[:, 1:] |= is_eod[:, 1:]  # an end-of-document id starts the next
    documents = begins.long().cumsum(1) - 1
    index = torch.arange(T, device=x.device).expand(B, T)
    first = torch.where(begins, index, torch.zeros_like(index)).cummax(1).values
    return documents, index - first
