"""The edge rule: JSON parsed with bounds, text that may reach the log, ids read back by path."""

from __future__ import annotations

import re

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient
from hypothesis import given
from hypothesis import strategies as st
from pydantic import BaseModel, Field, ValidationError

from fleetledger.adapters.http import edge


class TestLoads:
    @pytest.mark.parametrize(
        ("body", "kind"),
        [
            (b"NaN", "json_invalid"),
            (b'{"a": [Infinity]}', "json_invalid"),
            (b"1e400", "json_invalid"),
            (b'{"a": "\\ud800"}', "json_invalid"),
            (b"[" * 10_000 + b"]" * 10_000, "json_invalid"),
            (b"\xff\xfe", "json_invalid"),
        ],
    )
    def test_what_json_cannot_carry_back_is_refused(self, body: bytes, kind: str) -> None:
        """Non-finite numbers, lone surrogates, invalid UTF-8 and absurd nesting are refused
        while parsing: none could be encoded back in an answer."""
        with pytest.raises(edge.EdgeError) as refused:
            edge.loads(body)
        assert refused.value.kind == kind

    def test_nesting_past_the_limit_names_where(self) -> None:
        """A body deeper than the limit (but within the parser's) is refused at that depth."""
        body = b'{"a":' + b"[" * 70 + b"]" * 70 + b"}"
        with pytest.raises(edge.EdgeError, match="nests deeper than 64") as refused:
            edge.loads(body)
        assert refused.value.loc[0] == "a"

    def test_an_integer_past_two_to_the_53_is_refused_naming_it(self) -> None:
        with pytest.raises(edge.EdgeError) as refused:
            edge.loads(b'{"n": [1, 18446744073709551615]}')
        assert refused.value.loc == ("n", 1)

    def test_an_ordinary_body_parses(self) -> None:
        assert edge.loads(b'{"a": [1, 2.5, "x\\n", null]}') == {"a": [1, 2.5, "x\n", None]}


_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(min_value=-(2**60), max_value=2**60)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(max_size=5),
    lambda children: (
        st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=3), children, max_size=4)
    ),
    max_leaves=40,
)


class TestQuickCheck:
    @given(value=_JSON, max_depth=st.integers(min_value=0, max_value=6))
    def test_the_quick_check_refuses_exactly_what_the_located_one_does(
        self, value: object, max_depth: int
    ) -> None:
        """The check every request runs (depths only) passes a body exactly when the walk that
        names the offending place finds nothing: no fault slips through, none is made up."""
        try:
            edge._find_fault(value, max_depth)
        except edge.EdgeError:
            located = False
        else:
            located = True
        assert edge._within_rule(value, max_depth) is located


class TestCheckText:
    @pytest.mark.parametrize("text", ["a\x00b", "a\x1bb", "\x7f", "a\ud800"])
    def test_control_characters_and_surrogates_are_refused(self, text: str) -> None:
        with pytest.raises(edge.EdgeError, match="contains") as refused:
            edge.check_text(text, ("Pod", "name"), max_length=10, pattern=None)
        assert refused.value.loc == ("Pod", "name")

    def test_the_length_limit_is_named(self) -> None:
        with pytest.raises(edge.EdgeError, match="the limit is 3"):
            edge.check_text("abcd", (), max_length=3, pattern=None)

    def test_the_pattern_is_applied(self) -> None:
        with pytest.raises(edge.EdgeError, match="does not match"):
            edge.check_text("A_B", (), max_length=10, pattern=re.compile(edge.DNS_LABEL_PATTERN))


class _Body(BaseModel):
    model_config = edge.STRICT_JSON

    id: edge.Id
    selector: edge.LabelValue | None = None
    load: edge.FiniteFloat = Field(default=0, ge=0, le=100)


class TestTypes:
    @pytest.mark.parametrize("value", ["a/b", "a?b", "a b", "-a", "é", "x" * 129, "a\x00"])
    def test_an_id_is_url_safe(self, value: str) -> None:
        """An id must be readable back at /…/{id} as it is: no /, ?, spaces or other text."""
        with pytest.raises(ValidationError):
            _Body(id=value)

    @pytest.mark.parametrize("value", ["a\x1b", "a" * 64, "a b", "-a"])
    def test_a_selector_is_a_label_value(self, value: str) -> None:
        with pytest.raises(ValidationError):
            _Body(id="w1", selector=value)

    @pytest.mark.parametrize("body", ['{"id":"w","load":NaN}', '{"id":"w","load":Infinity}'])
    def test_non_finite_numbers_are_refused(self, body: str) -> None:
        with pytest.raises(ValidationError):
            _Body.model_validate_json(body)

    def test_valid_values_pass(self) -> None:
        body = _Body(id="w-1.a_b", selector="nvidia-A100_80GB", load=2.5)
        assert body.id == "w-1.a_b"


class TestEdgePaths:
    @pytest.mark.parametrize("path", ["/v1/x/a%00b", "/v1/x/a%1Bb", "/v1/x/%7F"])
    def test_a_path_holding_a_control_character_is_404(self, path: str) -> None:
        """No resource has such a name; the route never sees it."""
        app = FastAPI()
        seen: list[str] = []

        @app.get("/v1/x/{name}")
        def read(name: str) -> dict[str, str]:
            seen.append(name)
            return {"name": name}

        app.add_middleware(edge.EdgePaths)
        response = TestClient(app).get(path)

        assert response.status_code == 404
        assert seen == []
