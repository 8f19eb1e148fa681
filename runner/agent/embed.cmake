# Writes agent_blob.S: the built agent as bytes (.incbin) plus its SHA-256, for the launcher.
# Without AGENT (MLTRAIN_EMBED_AGENT=OFF): no bytes and an empty hash.
if(AGENT)
  file(SHA256 "${AGENT}" hash)
  set(incbin "    .incbin \"${AGENT}\"\n")
else()
  set(hash "")
  set(incbin "")
endif()
file(WRITE "${OUT}.tmp" "    .section .rodata\n    .global mltrain_agent_blob_start\n    .global mltrain_agent_blob_end\n    .global mltrain_agent_blob_hash\n    .balign 16\nmltrain_agent_blob_start:\n${incbin}mltrain_agent_blob_end:\n    .byte 0\nmltrain_agent_blob_hash:\n    .asciz \"${hash}\"\n    .section .note.GNU-stack,\"\",@progbits\n")
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
