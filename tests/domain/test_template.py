"""Machine templates: validation, canonical form, and a hash that is stable across processes."""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.template import (
    MachineTemplate,
    check_template,
    check_text,
    template_hash,
    text_problem,
)

SMALL = MachineTemplate(vm_size="Standard_D4s_v5")
GPU = MachineTemplate(
    vm_size="Standard_NC24ads_A100_v4",
    priority="spot",
    mode="User",
    gpu_profile="MIG1g",
    orchestrator_version="1.30.4",
    max_pods=110,
    kubelet_config=(("cpuManagerPolicy", "static"), ("imageGcHighThreshold", "85")),
    os_sku="AzureLinux",
    os_disk_size_gb=256,
    os_disk_type="Ephemeral",
    enable_fips=True,
    vnet_subnet_id="/subscriptions/0000/resourceGroups/rg/providers/Microsoft.Network/"
    "virtualNetworks/vnet/subnets/gpu",
)
SYSTEM = MachineTemplate(
    vm_size="Standard_E16s_v5", mode="System", orchestrator_version="1.29.7", max_pods=30
)

# Pinned once, never recomputed: a change here splits every pending batch across an upgrade.
GOLDEN = {
    "small": (SMALL, "90190a04420116bd"),
    "gpu": (GPU, "f7313035a17e13fc"),
    "system": (SYSTEM, "478e33a85fe54a7b"),
}


class TestTemplateHash:
    @pytest.mark.parametrize("name", sorted(GOLDEN))
    def test_golden_values(self, name: str) -> None:
        """The hash of each reference template equals the value pinned in this file."""
        template, expected = GOLDEN[name]
        assert template_hash(template) == expected

    def test_hash_is_sha256_of_canonical_json(self) -> None:
        """The hash is SHA-256 (16 hex chars) of sorted, compact JSON without absent fields."""
        canonical = (
            '{"enable_fips":false,"mode":"User","priority":"regular","vm_size":"Standard_D4s_v5"}'
        )
        expected = hashlib.sha256(canonical.encode()).hexdigest()[:16]
        assert template_hash(SMALL) == expected

    def test_stable_across_processes(self) -> None:
        """A fresh interpreter with a different string-hash seed computes the same hashes."""
        script = (
            "import json, sys\n"
            "sys.path.insert(0, sys.argv[1])\n"
            "from tests.domain.test_template import GOLDEN\n"
            "from fleetledger.domain.template import template_hash\n"
            "print(json.dumps({k: template_hash(t) for k, (t, _) in GOLDEN.items()}))\n"
        )
        root = Path(__file__).resolve().parents[2]
        env = {**os.environ, "PYTHONHASHSEED": "12345"}
        output = subprocess.run(
            [sys.executable, "-c", script, str(root)],
            check=True,
            capture_output=True,
            text=True,
            env=env,
            cwd=root,
        ).stdout
        assert json.loads(output) == {k: v for k, (_, v) in GOLDEN.items()}

    def test_none_and_absent_spell_the_same(self) -> None:
        """A field given as null, or an empty kubelet config, hashes like the field left out."""
        explicit = MachineTemplate.from_data(
            {
                "vm_size": "Standard_D4s_v5",
                "gpu_profile": None,
                "orchestrator_version": None,
                "max_pods": None,
                "kubelet_config": {},
                "os_sku": None,
                "os_disk_size_gb": None,
                "os_disk_type": None,
                "vnet_subnet_id": None,
            }
        )
        absent = MachineTemplate.from_data({"vm_size": "Standard_D4s_v5"})
        assert template_hash(explicit) == template_hash(absent) == GOLDEN["small"][1]

    def test_per_machine_variations_are_not_template_fields(self) -> None:
        """Machine name, zones and tags are not template fields, so they cannot reach the hash."""
        names = {f.name for f in dataclasses.fields(MachineTemplate)}
        assert not names & {"machine_name", "name", "zones", "zone", "tags"}

    def test_kubelet_config_order_does_not_matter(self) -> None:
        """Kubelet settings given in another order give the same template and the same hash."""
        reordered = dataclasses.replace(
            GPU, kubelet_config=(("imageGcHighThreshold", "85"), ("cpuManagerPolicy", "static"))
        )
        assert reordered == GPU
        assert template_hash(reordered) == template_hash(GPU)

    @pytest.mark.parametrize(
        ("field", "value"),
        [
            ("vm_size", "Standard_D8s_v5"),
            ("priority", "spot"),
            ("mode", "System"),
            ("gpu_profile", "MIG2g"),
            ("orchestrator_version", "1.31.0"),
            ("max_pods", 50),
            ("kubelet_config", (("cpuManagerPolicy", "none"),)),
            ("os_sku", "Ubuntu"),
            ("os_disk_size_gb", 64),
            ("os_disk_type", "Managed"),
            ("enable_fips", True),
            ("vnet_subnet_id", "/subnets/other"),
        ],
    )
    def test_every_template_field_enters_the_hash(self, field: str, value: object) -> None:
        """Changing any one template field changes the hash."""
        changed = dataclasses.replace(SMALL, **{field: value})  # type: ignore[arg-type]
        assert template_hash(changed) != template_hash(SMALL)


class TestMachineTemplateValidation:
    @pytest.mark.parametrize(
        "kwargs",
        [
            {"vm_size": ""},
            {"vm_size": "x", "priority": "premium"},
            {"vm_size": "x", "max_pods": 0},
            {"vm_size": "x", "max_pods": True},
            {"vm_size": "x", "os_disk_size_gb": 128.0},
            {"vm_size": "x", "enable_fips": 1},
            {"vm_size": "x", "mode": 3},
            {"vm_size": "x", "kubelet_config": (("a", "1"), ("a", "2"))},
            {"vm_size": "x", "kubelet_config": (("a",),)},
        ],
    )
    def test_malformed_values_are_refused(self, kwargs: dict[str, object]) -> None:
        """Values that would hash differently from an equal template are refused up front."""
        with pytest.raises(InvalidCommand):
            MachineTemplate(**kwargs)  # type: ignore[arg-type]

    def test_duplicate_kubelet_key_is_named(self) -> None:
        """A kubelet key given twice is refused with the key in the message."""
        with pytest.raises(InvalidCommand, match="maxPods"):
            MachineTemplate(vm_size="x", kubelet_config=(("maxPods", "1"), ("maxPods", "2")))

    def test_data_round_trip(self) -> None:
        """``from_data(to_data(t))`` gives back ``t``, through JSON."""
        for template, _ in GOLDEN.values():
            data = json.loads(json.dumps(template.to_data()))
            assert MachineTemplate.from_data(data) == template

    def test_unknown_field_is_refused(self) -> None:
        """A misspelt field is refused rather than silently splitting batches."""
        with pytest.raises(ValueError, match="vmsize"):
            MachineTemplate.from_data({"vm_size": "x", "vmsize": "y"})

    def test_missing_vm_size_is_a_value_error(self) -> None:
        """Data without the one required field is a ValueError, not a TypeError."""
        with pytest.raises(ValueError, match="incomplete"):
            MachineTemplate.from_data({"mode": "User"})


class TestAzureLimits:
    @pytest.mark.parametrize(
        ("template", "field"),
        [
            (MachineTemplate(vm_size="x", max_pods=9), "max_pods"),
            (MachineTemplate(vm_size="x", max_pods=251), "max_pods"),
            (MachineTemplate(vm_size="x", os_disk_size_gb=29), "os_disk_size_gb"),
            (MachineTemplate(vm_size="x", os_disk_size_gb=2049), "os_disk_size_gb"),
            (MachineTemplate(vm_size="\t"), "vm_size"),
            (MachineTemplate(vm_size="x", mode="User\x00"), "mode"),
            (MachineTemplate(vm_size="x", os_sku="\ud83d"), "os_sku"),
            (MachineTemplate(vm_size="x", vnet_subnet_id="/s" * 513), "vnet_subnet_id"),
            (MachineTemplate(vm_size="x", kubelet_config=(("a\x00", "1"),)), "kubelet_config"),
            (
                MachineTemplate(
                    vm_size="x", kubelet_config=tuple((f"k{i:02d}", "1") for i in range(33))
                ),
                "kubelet_config",
            ),
        ],
    )
    def test_out_of_range_templates_are_refused_naming_the_field(
        self, template: MachineTemplate, field: str
    ) -> None:
        """``check_template`` refuses what Azure or the log would, naming ``template <field>``."""
        with pytest.raises(InvalidCommand) as refused:
            check_template(template)

        assert refused.value.reason.split(" ")[:2] == ["template", field]

    @pytest.mark.parametrize("name", sorted(GOLDEN))
    def test_the_reference_templates_pass(self, name: str) -> None:
        """Real templates are within every limit."""
        check_template(GOLDEN[name][0])

    def test_the_limits_are_inclusive(self) -> None:
        """10 and 250 pods, 30 and 2048 GB are accepted."""
        for pods, disk in ((10, 30), (250, 2048)):
            check_template(MachineTemplate(vm_size="x", max_pods=pods, os_disk_size_gb=disk))

    def test_construction_does_not_apply_the_limits(self) -> None:
        """Templates decoded from old events load whatever today's limits say."""
        template = MachineTemplate.from_data({"vm_size": "x", "max_pods": 1000})

        assert template.max_pods == 1000


class TestText:
    @pytest.mark.parametrize(
        ("value", "problem"),
        [
            ("a\x00", "control character (U+0000) at position 1"),
            ("\x7f", "control character (U+007F)"),
            ("\x85", "control character (U+0085)"),
            ("a\udc80", "surrogate (U+DC80)"),
        ],
    )
    def test_problems_are_named_with_their_code_point(self, value: str, problem: str) -> None:
        """The reason says which character and where."""
        found = text_problem(value)

        assert found is not None and problem in found

    @pytest.mark.parametrize("value", ["Standard_D4s_v5", "機-1", "a b", "🚀", ""])
    def test_printable_text_has_no_problem(self, value: str) -> None:
        """Any printable text, in any script, is fine."""
        assert text_problem(value) is None

    @pytest.mark.parametrize("value", ["", " ", "\u3000", " \u00a0 "])
    def test_blank_is_refused_unless_allowed(self, value: str) -> None:
        """Empty or whitespace-only text is refused for names, allowed where ``blank`` says so."""
        check_text("value", value, max_length=5, blank=True)
        with pytest.raises(InvalidCommand, match=r"^name must not be empty"):
            check_text("name", value, max_length=5)

    def test_length_is_checked_first(self) -> None:
        """A long value is refused by length without scanning it."""
        with pytest.raises(InvalidCommand, match=r"^name is 6 characters long; the limit is 5"):
            check_text("name", "\x00" * 6, max_length=5)
