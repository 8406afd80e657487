defmodule Condukt.Sandbox.Edit do
  @moduledoc false
  # The one rule of edit_file/4, shared by every built-in sandbox so that
  # they agree byte for byte: `old` must occur exactly once in `content`.

  @doc """
  The new content, or why not: `:empty_old_text`, `:old_text_not_found`,
  `{:old_text_not_unique, count}`. Occurrences are counted overlapping
  ("aa" occurs twice in "aaa"), since any second match makes the edit
  ambiguous.
  """
  @spec replace_once(binary(), binary(), binary()) ::
          {:ok, iodata()} | {:error, :empty_old_text | :old_text_not_found | {:old_text_not_unique, pos_integer()}}
  def replace_once(content, old, new) do
    with {:ok, {at, len}} <- find_once(content, old) do
      {:ok, [binary_part(content, 0, at), new, binary_part(content, at + len, byte_size(content) - at - len)]}
    end
  end

  @doc "The offset and length of the one occurrence of `old` in `content`."
  @spec find_once(binary(), binary()) ::
          {:ok, {non_neg_integer(), pos_integer()}}
          | {:error, :empty_old_text | :old_text_not_found | {:old_text_not_unique, pos_integer()}}
  def find_once(_content, ""), do: {:error, :empty_old_text}

  def find_once(content, old) do
    case :binary.match(content, old) do
      :nomatch ->
        {:error, :old_text_not_found}

      {at, _len} = found ->
        case count_from(content, old, at + 1, 1) do
          1 -> {:ok, found}
          n -> {:error, {:old_text_not_unique, n}}
        end
    end
  end

  defp count_from(content, old, from, count) do
    case :binary.match(content, old, scope: {from, byte_size(content) - from}) do
      :nomatch -> count
      {at, _} -> count_from(content, old, at + 1, count + 1)
    end
  end
end
