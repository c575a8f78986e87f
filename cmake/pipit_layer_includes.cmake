# Fails when a file of layer LAYER includes a header of a layer it may not use.
# cmake -DLAYER=<layer> -DALLOWED=<layers, comma-separated> -DLAYERS=<every layer folder,
#       comma-separated> -DROOT=<source dir> -DSTAMP=<file to touch on success> -P <this>
# A header path's first component names its layer ("nn/module.h" is nn's). LAYER may include
# its own headers, those of ALLOWED, and headers of libraries; never samples/, tools/, tests/
# or bench/. A header at the root (pipit.h) counts as the headers it includes.
cmake_minimum_required(VERSION 3.25)
string(REPLACE "," ";" allowed "${ALLOWED}")
string(REPLACE "," ";" layers "${LAYERS}")
set(above support samples tools tests bench)
list(JOIN allowed ", " allowed_text)
if(NOT allowed_text)
  set(allowed_text "no other layer")
endif()

# The layer folders (or the folders above every layer) that `header`, included from `file`,
# belongs to: its first path component, or for a root header those of its own includes.
function(header_owners header file out)
  set(owners)
  if(header MATCHES "^([^/]+)/")
    set(owners ${CMAKE_MATCH_1})
  else()
    get_filename_component(dir ${ROOT}/${file} DIRECTORY)
    if(NOT EXISTS ${dir}/${header} AND EXISTS ${ROOT}/${header})
      file(STRINGS ${ROOT}/${header} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"][^/]+/")
      foreach(line ${lines})
        if(line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]([^/]+)/")
          list(APPEND owners ${CMAKE_MATCH_1})
        endif()
      endforeach()
    endif()
  endif()
  set(${out} ${owners} PARENT_SCOPE)
endfunction()

file(GLOB_RECURSE files RELATIVE ${ROOT} ${ROOT}/${LAYER}/*.h ${ROOT}/${LAYER}/*.cpp
     ${ROOT}/${LAYER}/*.cuh ${ROOT}/${LAYER}/*.cu)
list(SORT files)
set(violations)
foreach(file ${files})
  file(STRINGS ${ROOT}/${file} lines REGEX "^[ \t]*#[ \t]*include[ \t]*[<\"]")
  foreach(line ${lines})
    if(NOT line MATCHES "^[ \t]*#[ \t]*include[ \t]*[<\"]([^\">]+)[\">]")
      continue()
    endif()
    set(header ${CMAKE_MATCH_1})
    header_owners(${header} ${file} owners)
    set(forbidden)
    foreach(owner ${owners})
      # Libraries' headers (<nlohmann/json.hpp>) belong to no layer.
      if((owner IN_LIST layers OR owner IN_LIST above) AND NOT owner STREQUAL LAYER
         AND NOT owner IN_LIST allowed)
        list(APPEND forbidden ${owner})
      endif()
    endforeach()
    if(forbidden)
      list(REMOVE_DUPLICATES forbidden)
      list(JOIN forbidden ", " forbidden)
      list(APPEND violations "  ${file}: #include \"${header}\" (${forbidden})")
    endif()
  endforeach()
endforeach()

if(violations)
  list(JOIN violations "\n" violations_text)
  message(FATAL_ERROR
          "pipit layer check: layer ${LAYER} includes headers of layers above it.\n"
          "${LAYER} may include only ${LAYER}/ and ${allowed_text} "
          "(docs/ARCHITECTURE.md, \"Layers\"):\n${violations_text}\n"
          "Move the code to the layer that may use what it needs, or what it needs down.")
endif()
file(TOUCH ${STAMP})
