# fish
