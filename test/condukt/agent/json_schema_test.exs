defmodule Condukt.JSONSchemaTest do
  use ExUnit.Case, async: true

  alias Condukt.JSONSchema

  doctest Condukt.JSONSchema

  @decision %{
    type: "object",
    properties: %{decision: %{type: "string", enum: ["allow", "deny"]}, reason: %{type: "string", maxLength: 10}},
    required: ["decision", "reason"],
    additionalProperties: false
  }

  test "a value that fits" do
    assert :ok = JSONSchema.validate(%{"decision" => "allow", "reason" => "ok"}, @decision)
  end

  test "each violation is named with its path" do
    assert {:error, errors} = JSONSchema.validate(%{"decision" => "maybe", "extra" => 1}, @decision)
    assert Enum.any?(errors, &(&1 =~ "$.decision: expected one of"))
    assert Enum.any?(errors, &(&1 =~ "missing required property \"reason\""))
    assert Enum.any?(errors, &(&1 =~ "unexpected property \"extra\""))

    assert {:error, [e]} =
             JSONSchema.validate(%{"decision" => "deny", "reason" => String.duplicate("x", 11)}, @decision)

    assert e =~ "longer than 10"
    assert {:error, [_]} = JSONSchema.validate("allow", @decision)
  end

  test "arrays, numbers, anyOf, nullable types" do
    schema = %{
      "type" => "object",
      "properties" => %{
        "n" => %{"type" => "integer", "minimum" => 1, "maximum" => 3},
        "xs" => %{"type" => "array", "items" => %{"type" => "string"}, "maxItems" => 2},
        "v" => %{"anyOf" => [%{"type" => "string"}, %{"type" => "null"}]},
        "w" => %{"type" => ["number", "null"]}
      }
    }

    assert :ok = JSONSchema.validate(%{"n" => 2, "xs" => ["a"], "v" => nil, "w" => 1.5}, schema)
    assert {:error, errs} = JSONSchema.validate(%{"n" => 4, "xs" => ["a", 1, "c"], "v" => 1, "w" => "x"}, schema)
    assert length(errs) == 5
    assert Enum.any?(errs, &(&1 =~ "$.xs[1]: expected string"))
  end
end
