"""Request bodies into domain values: the template of a body."""

from __future__ import annotations

import pytest

from fleetledger.adapters.http.models import TemplateBody
from fleetledger.domain.errors import InvalidCommand
from fleetledger.domain.template import MachineTemplate


class TestToTemplate:
    def test_gives_the_domain_template_of_the_body(self) -> None:
        body = TemplateBody(
            vm_size="Standard_D4s_v5",
            max_pods=110,
            kubelet_config={"maxPods": "110", "cpuManagerPolicy": "static"},
        )

        assert body.to_template() == MachineTemplate(
            vm_size="Standard_D4s_v5",
            max_pods=110,
            kubelet_config=(("cpuManagerPolicy", "static"), ("maxPods", "110")),
        )

    def test_bodies_that_differ_only_in_kubelet_order_give_one_template(self) -> None:
        first = TemplateBody(vm_size="Standard_D4s_v5", kubelet_config={"a": "1", "b": "2"})
        second = TemplateBody(vm_size="Standard_D4s_v5", kubelet_config={"b": "2", "a": "1"})

        assert first.to_template() == second.to_template()

    def test_bodies_that_differ_give_different_templates(self) -> None:
        """Remembered templates are keyed by every field: one changed field is another
        template, whatever was asked for before."""
        base = TemplateBody(vm_size="Standard_D4s_v5").to_template()

        assert TemplateBody(vm_size="Standard_D4s_v5", enable_fips=True).to_template() != base
        assert TemplateBody(vm_size="Standard_D4s_v5", priority="spot").to_template() != base

    def test_a_value_the_domain_refuses_is_refused_every_time(self) -> None:
        body = TemplateBody(vm_size="Standard_D4s_v5", kubelet_config={"k": "v"})
        body.kubelet_config["k"] = 5  # type: ignore[assignment]  # past validation, as a bug would

        for _ in range(2):
            with pytest.raises(InvalidCommand, match="kubelet_config"):
                body.to_template()
