"""The plumbing every layer may use, importing nothing else of vitdense: errors with the fix
in their message (`errors`), safe unpickling (`safe_load`), precision (`precision`), image
files (`images`), the preprocessing a checkpoint records (`preprocess`), the drawing of
pictures (`draw`), the module paths of before the layer-first layout and the lazy
package exports (`moved`)."""
