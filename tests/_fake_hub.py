"""A stand-in for ``huggingface_hub.HfApi`` that records the calls and the bytes a push uploads (no network)."""

from __future__ import annotations


class FakeHfApi:
    """Records calls and the bytes each commit operation uploads."""

    def __init__(self, fail_on: str | None = None):
        self.fail_on = fail_on
        self.calls: list[tuple[str, dict]] = []
        self.uploaded: dict[str, bytes] = {}

    def create_repo(self, **kw):
        self.calls.append(("create_repo", kw))
        if self.fail_on == "create_repo":
            raise ConnectionError("Hub unreachable")
        return f"https://huggingface.co/{kw['repo_id']}"

    def create_branch(self, **kw):
        self.calls.append(("create_branch", kw))

    def create_commit(self, **kw):
        self.calls.append(("create_commit", kw))
        for op in kw["operations"]:
            content = op.path_or_fileobj
            if isinstance(content, str):
                with open(content, "rb") as fh:
                    content = fh.read()
            self.uploaded[op.path_in_repo] = content
        if self.fail_on == "create_commit":
            raise TimeoutError("connection reset during upload")
        return "commit-info"
