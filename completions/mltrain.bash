# mltrain bash completion
