"""core/spaces.py, the key file's admin role, and a space named in the prompt's memory section."""

from __future__ import annotations

import pytest

from serve_app.core.auth import KeyRing, hash_key
from serve_app.core.ids import ID_PATTERN, pseudonym
from serve_app.core.memory_lines import MemoryItem, render
from serve_app.core.spaces import allows, denied, space_of, space_owner, unique
from serve_app.settings import Settings


def test_roles_cover_what_is_beneath_them():
    assert allows("admin", "write") and allows("write", "read") and allows("read", "read")
    assert not allows("read", "write") and not allows("write", "admin") and not allows(None, "read")
    assert denied(["a", "b", "c"], {"a": "write", "b": "read"}, "write") == ["b", "c"]
    assert unique(["b", "a", "b"]) == ["b", "a"]


def test_a_space_owner_id_can_never_be_a_user_id():
    import re

    owner = space_owner("team")
    assert space_of(owner) == "team" and space_of("alice") is None
    assert not re.fullmatch(ID_PATTERN, owner)  # no user route can name it
    assert pseudonym("t", "alice") == pseudonym("t", "alice") != pseudonym("t", "bob")
    assert "alice" not in pseudonym("t", "alice")


def test_the_key_file_names_a_tenants_admin(tmp_path):
    admin, member = hash_key("k-admin"), hash_key("k-member")
    path = tmp_path / "keys"
    path.write_text(f"acme:{admin}:admin\nacme:{member}\n")
    ring = KeyRing.from_file(path)
    assert ring.tenant_for("k-admin") == ("acme", admin) and ring.is_admin(admin) and not ring.is_admin(member)
    path.write_text(f"acme:{member}:root\n")
    with pytest.raises(ValueError, match="admin"):
        KeyRing.from_file(path)
    settings = Settings(api_keys={admin: "acme:admin", member: "acme"})
    assert settings.keyring().is_admin(admin) and settings.keyring().tenant_for("k-admin") == ("acme", admin)
    merged = KeyRing({member: "acme"}, {member}).merged(KeyRing({member: "acme"}))
    assert not merged.is_admin(member)  # the later source says what the key is


def test_the_prompt_names_the_space_a_memory_came_from():
    own = MemoryItem("user: I like tea.", "2024-05-02", "s1", 1)
    shared = MemoryItem("Deploys need two approvals.", "2024-05-02", "", 0, "memory", space="ops")
    text = render([own, shared])
    assert "[2024-05-02]\n- user: I like tea." in text
    assert "[2024-05-02, space ops]\n- Deploys need two approvals." in text
