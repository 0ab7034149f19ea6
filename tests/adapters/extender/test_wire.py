"""The extender v1 wire format: golden JSON in and out, in both ``nodeCacheCapable`` forms."""

from __future__ import annotations

import json

import pytest

from fleetledger.adapters.extender import wire
from fleetledger.domain.testbeds import PodToPlace

POD_JSON = """
{"metadata": {"name": "j1-exec-1", "namespace": "jobs", "uid": "pod-uid-1",
              "annotations": {"fleetledger.io/testbed": "bed",
                              "fleetledger.io/slot-ids": "0,2"}},
 "spec": {"schedulerName": "fleetledger", "containers": [{"name": "executor"}]}}
"""
POD = wire.ExtenderPod(
    "j1-exec-1",
    "jobs",
    "pod-uid-1",
    {"fleetledger.io/testbed": "bed", "fleetledger.io/slot-ids": "0,2"},
)
NODE_N1 = {"metadata": {"name": "n1", "labels": {"testbed": "1"}}, "status": {"phase": "Ready"}}
NODE_N2 = {"metadata": {"name": "n2", "labels": {"testbed": "2"}}}

CACHE_CAPABLE_ARGS = f'{{"Pod": {POD_JSON}, "Nodes": null, "NodeNames": ["n1", "n2"]}}'
FULL_NODES_ARGS = (
    f'{{"Pod": {POD_JSON}, "Nodes": {{"items": {json.dumps([NODE_N1, NODE_N2])}}}, '
    '"NodeNames": null}'
)


class TestFilterArgs:
    def test_node_cache_capable_args(self) -> None:
        """Node names come in; the pod's metadata is read."""
        args = wire.parse_filter_args(json.loads(CACHE_CAPABLE_ARGS))
        assert args == wire.FilterArgs(POD, ("n1", "n2"))
        assert args.node_cache_capable

    def test_whole_nodes_args(self) -> None:
        """Whole node objects come in and are kept as received."""
        args = wire.parse_filter_args(json.loads(FULL_NODES_ARGS))
        assert args.node_names == ("n1", "n2")
        assert args.nodes == (NODE_N1, NODE_N2)
        assert not args.node_cache_capable

    @pytest.mark.parametrize("body", [CACHE_CAPABLE_ARGS, FULL_NODES_ARGS])
    def test_args_round_trip(self, body: str) -> None:
        """Encoding parsed args and parsing them again gives the same args."""
        args = wire.parse_filter_args(json.loads(body))
        assert wire.parse_filter_args(wire.encode_filter_args(args)) == args

    def test_encoded_cache_capable_args_are_golden(self) -> None:
        """The encoded args have exactly the scheduler's keys."""
        assert wire.encode_filter_args(wire.FilterArgs(POD, ("n1",))) == {
            "Pod": {
                "metadata": {
                    "name": "j1-exec-1",
                    "namespace": "jobs",
                    "uid": "pod-uid-1",
                    "annotations": dict(POD.annotations),
                }
            },
            "Nodes": None,
            "NodeNames": ["n1"],
        }

    def test_args_without_nodes_are_refused(self) -> None:
        """Args carrying neither form of nodes are malformed."""
        with pytest.raises(wire.WireError, match="neither Nodes nor NodeNames"):
            wire.parse_filter_args({"Pod": json.loads(POD_JSON)})

    def test_pod_without_metadata_is_refused(self) -> None:
        """A pod must have its metadata."""
        with pytest.raises(wire.WireError, match=r"Pod\.metadata"):
            wire.parse_filter_args({"Pod": {}, "NodeNames": []})


class TestFilterResult:
    RESULT = wire.FilterResult(("n1",), {"n2": "pod j1-exec-1 has slot 0, which is on node n1"})

    def test_node_cache_capable_result_is_golden(self) -> None:
        """A node-cache-capable answer carries node names, null nodes."""
        args = wire.parse_filter_args(json.loads(CACHE_CAPABLE_ARGS))
        assert json.dumps(wire.encode_filter_result(self.RESULT, args=args), sort_keys=True) == (
            '{"Error": "", "FailedAndUnresolvableNodes": {}, '
            '"FailedNodes": {"n2": "pod j1-exec-1 has slot 0, which is on node n1"}, '
            '"NodeNames": ["n1"], "Nodes": null}'
        )

    def test_whole_nodes_result_returns_the_nodes_as_received(self) -> None:
        """Without the node cache the passing node objects go back unchanged."""
        args = wire.parse_filter_args(json.loads(FULL_NODES_ARGS))
        body = wire.encode_filter_result(self.RESULT, args=args)
        assert body["Nodes"] == {"items": [NODE_N1]}
        assert body["NodeNames"] is None

    def test_no_node_result(self) -> None:
        """No free slot: an empty node list and the reason per node."""
        args = wire.parse_filter_args(json.loads(CACHE_CAPABLE_ARGS))
        result = wire.FilterResult((), {"n1": "no free slot", "n2": "no free slot"})
        body = wire.encode_filter_result(result, args=args)
        assert body["NodeNames"] == [] and body["FailedNodes"] == {
            "n1": "no free slot",
            "n2": "no free slot",
        }

    @pytest.mark.parametrize("body", [CACHE_CAPABLE_ARGS, FULL_NODES_ARGS])
    def test_result_round_trip(self, body: str) -> None:
        """A result parses back from its encoding in either form."""
        args = wire.parse_filter_args(json.loads(body))
        encoded = json.loads(json.dumps(wire.encode_filter_result(self.RESULT, args=args)))
        assert wire.parse_filter_result(encoded) == self.RESULT

    def test_go_nil_maps_parse_as_empty(self) -> None:
        """A Go scheduler's null maps and missing error read as empty."""
        body = {"Nodes": None, "NodeNames": ["n1"], "FailedNodes": None}
        assert wire.parse_filter_result(body) == wire.FilterResult(("n1",))


class TestPreempt:
    META_ARGS = (
        f'{{"Pod": {POD_JSON}, "NodeNameToVictims": null, "NodeNameToMetaVictims": '
        '{"n1": {"Pods": [{"UID": "ghost-uid"}], "NumPDBViolations": 0}}}'
    )
    FULL_ARGS = (
        f'{{"Pod": {POD_JSON}, "NodeNameToVictims": {{"n1": {{"Pods": '
        '[{"metadata": {"name": "ghost", "uid": "ghost-uid"}}], "NumPDBViolations": 1}}}'
    )

    def test_meta_victims_args(self) -> None:
        """Node-cache-capable preemption args carry victims by UID."""
        args = wire.parse_preempt_args(json.loads(self.META_ARGS))
        assert args == wire.PreemptArgs(POD, {"n1": wire.MetaVictims(("ghost-uid",))})

    def test_whole_victims_args(self) -> None:
        """Otherwise the victims are whole pods; their UIDs are read."""
        args = wire.parse_preempt_args(json.loads(self.FULL_ARGS))
        assert args == wire.PreemptArgs(
            POD, {"n1": wire.MetaVictims(("ghost-uid",), 1)}, node_cache_capable=False
        )

    @pytest.mark.parametrize("body", [META_ARGS, FULL_ARGS])
    def test_args_round_trip(self, body: str) -> None:
        """Preemption args parse back from their encoding in either form."""
        args = wire.parse_preempt_args(json.loads(body))
        assert wire.parse_preempt_args(wire.encode_preempt_args(args)) == args

    def test_result_is_golden(self) -> None:
        """The answer names the node and the ghost pod to evict, as meta victims."""
        result = wire.PreemptResult({"n1": wire.MetaVictims(("ghost-uid",))})
        assert json.dumps(wire.encode_preempt_result(result)) == (
            '{"NodeNameToMetaVictims": '
            '{"n1": {"Pods": [{"UID": "ghost-uid"}], "NumPDBViolations": 0}}}'
        )
        assert wire.parse_preempt_result(wire.encode_preempt_result(result)) == result

    def test_no_node_result(self) -> None:
        """No slot free: an empty map."""
        assert wire.encode_preempt_result(wire.PreemptResult({})) == {"NodeNameToMetaVictims": {}}

    def test_bad_pdb_count_is_refused(self) -> None:
        """The PDB violation count is an integer."""
        body = {
            "Pod": json.loads(POD_JSON),
            "NodeNameToMetaVictims": {"n1": {"NumPDBViolations": "x"}},
        }
        with pytest.raises(wire.WireError, match="NumPDBViolations"):
            wire.parse_preempt_args(body)


class TestPodToPlace:
    def test_annotations_give_testbed_and_slots(self) -> None:
        """The pod's annotations name its testbed and the application's slot ids."""
        assert wire.pod_to_place(POD) == ("bed", PodToPlace("j1-exec-1", "pod-uid-1", (0, 2)))

    def test_pod_without_annotations_is_refused(self) -> None:
        """A pod that is not a batch job's cannot be placed, and the error says why."""
        with pytest.raises(wire.WireError, match=r"lacks the fleetledger\.io/testbed"):
            wire.pod_to_place(wire.ExtenderPod("p", "default", "u"))

    def test_bad_slot_ids_are_refused(self) -> None:
        """Slot ids are integers joined by commas; the error names the annotation."""
        pod = wire.ExtenderPod(
            "p", "jobs", "u", {"fleetledger.io/testbed": "bed", "fleetledger.io/slot-ids": "0;2"}
        )
        with pytest.raises(wire.WireError, match="joined by ','") as error:
            wire.pod_to_place(pod)
        assert error.value.loc == ("Pod", "metadata", "annotations", "fleetledger.io/slot-ids")

    def test_half_a_slot_request_names_what_is_missing(self) -> None:
        """A testbed without slot ids is refused, saying which annotation to add."""
        pod = wire.ExtenderPod("p", "jobs", "u", {"fleetledger.io/testbed": "bed"})
        with pytest.raises(wire.WireError, match=r"no fleetledger\.io/slot-ids") as error:
            wire.pod_to_place(pod)
        assert error.value.loc[-1] == "fleetledger.io/slot-ids"


SEED_POD_JSON = """
{"metadata": {"name": "spark-exec-2", "namespace": "jobs", "uid": "pod-uid-2",
              "labels": {"batchjob.tuberlin.de/slots-resource-name": "bed",
                         "batchjob.tuberlin.de/slots-ids": "1_3_4"}}}
"""


class TestSeedLabels:
    """Pods written for the original operator name their testbed and slots in labels."""

    def test_labels_give_testbed_and_slots(self) -> None:
        """The slot ids of a label are joined by underscores (a label value holds no comma)."""
        args = wire.parse_filter_args({"Pod": json.loads(SEED_POD_JSON), "NodeNames": ["n1"]})

        assert wire.pod_to_place(args.pod) == (
            "bed",
            PodToPlace("spark-exec-2", "pod-uid-2", (1, 3, 4)),
        )

    def test_labels_round_trip(self) -> None:
        """A pod's labels are encoded for a fake scheduler as they were read."""
        args = wire.parse_filter_args({"Pod": json.loads(SEED_POD_JSON), "NodeNames": ["n1"]})
        assert wire.parse_filter_args(wire.encode_filter_args(args)) == args

    def test_the_project_annotations_come_first(self) -> None:
        """A pod carrying both protocols is placed by this project's annotations."""
        pod = wire.ExtenderPod(
            "p",
            "jobs",
            "u",
            annotations={"fleetledger.io/testbed": "ours", "fleetledger.io/slot-ids": "5"},
            labels={
                "batchjob.tuberlin.de/slots-resource-name": "theirs",
                "batchjob.tuberlin.de/slots-ids": "0_1",
            },
        )
        assert wire.pod_to_place(pod) == ("ours", PodToPlace("p", "u", (5,)))

    def test_commas_in_a_label_are_refused(self) -> None:
        """The label protocol joins ids with underscores only; anything else is named."""
        pod = wire.ExtenderPod(
            "p",
            "jobs",
            "u",
            labels={
                "batchjob.tuberlin.de/slots-resource-name": "bed",
                "batchjob.tuberlin.de/slots-ids": "0,1",
            },
        )
        with pytest.raises(wire.WireError, match="joined by '_'") as error:
            wire.pod_to_place(pod)
        assert error.value.loc == ("Pod", "metadata", "labels", "batchjob.tuberlin.de/slots-ids")

    def test_a_label_without_slot_ids_is_refused(self) -> None:
        """The testbed label alone does not place a pod."""
        pod = wire.ExtenderPod(
            "p", "jobs", "u", labels={"batchjob.tuberlin.de/slots-resource-name": "bed"}
        )
        with pytest.raises(wire.WireError, match=r"no batchjob\.tuberlin\.de/slots-ids"):
            wire.pod_to_place(pod)


class TestErrorLocations:
    def test_a_nested_field_is_located(self) -> None:
        """The error's loc is the path to the field at fault, list indexes included."""
        body = {
            "Pod": json.loads(POD_JSON),
            "Nodes": {"items": [NODE_N1, {"metadata": {"name": 7}}]},
        }
        with pytest.raises(wire.WireError) as error:
            wire.parse_filter_args(body)
        assert error.value.loc == ("Nodes", "items", 1, "metadata", "name")
        assert str(error.value) == "Nodes.items[1].metadata.name: expected text, got int"

    def test_preemption_args_need_one_victims_map(self) -> None:
        """The scheduler always sends one of the two maps; a body with neither is refused."""
        body = {"Pod": json.loads(POD_JSON), "NodeNameToVictims": None}
        with pytest.raises(wire.WireError, match="neither NodeNameToMetaVictims") as error:
            wire.parse_preempt_args(body)
        assert error.value.loc == ("NodeNameToMetaVictims",)

    def test_the_victims_map_names_the_candidate_nodes(self) -> None:
        """The scheduler's candidates for preemption are the keys of its victims map."""
        args = wire.PreemptArgs(POD, {"n2": wire.MetaVictims(()), "n1": wire.MetaVictims(())})
        assert args.candidate_nodes == ("n2", "n1")
