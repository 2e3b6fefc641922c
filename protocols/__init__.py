"""Wire protocols in front of the mqserver core; one package per protocol."""
